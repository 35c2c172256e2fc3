"""``orcasim trace``: run a vLLM harness workload on the step clock and write its step trace."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "trace", help="run a vLLM-harness workload (JSON) with the vllm-v1 policy, step by step")
    t.add_argument("workload", type=Path,
                   help="workload JSON: a request list or {config, requests}")
    t.add_argument("--out", type=Path, required=True, help="trace file to write (JSONL)")
    t.add_argument("--block-tables", action="store_true",
                   help="add each scheduled request's block ids to the trace")
    t.add_argument("--compare", type=Path, metavar="TRACE",
                   help="compare with a reference trace (e.g. the harness's); exit 1 if it differs")
    t.set_defaults(handler=trace)


def trace(args: argparse.Namespace) -> int:
    from orcasim.errors import OrcasimError
    from orcasim.steptrace import (
        first_difference,
        load_workload,
        read_trace,
        run_trace,
        write_trace,
    )

    workload = load_workload(args.workload)
    lines, summary = run_trace(workload, block_tables=args.block_tables)
    write_trace(args.out, lines, summary)
    print(f"{args.workload}: {len(workload.requests)} requests, {len(lines)} steps "
          f"(last step {summary['last_step']}), {summary['num_preemptions']} preemptions, "
          f"{summary['ms_per_step']} ms/step; wrote {args.out}")
    if args.compare is None:
        return 0
    try:
        ref, _ = read_trace(args.compare)
    except (OSError, ValueError) as err:
        raise OrcasimError(f"{args.compare}: cannot read the reference trace: {err}") from None
    if not args.block_tables:  # the reference may list block tables; compare the rest
        for line in ref:
            for e in line.get("scheduled", ()):
                e.pop("blocks", None)
    diff = first_difference(lines, ref)
    if diff is None:
        print(f"{len(ref)}/{len(ref)} steps identical to {args.compare}")
        return 0
    print(f"differs from {args.compare}: {diff}")
    return 1

"""``orcasim trace``: run a vLLM harness workload on the step clock and write its step trace.

Exit status: 0, or 1 when ``--compare`` finds a difference (or the run
fails); 2 for a missing or unreadable workload or reference, or an ``--out``
that cannot be written (checked before the run; missing parent directories
are created).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orcasim.commands.common import check_input_file, check_output_file, make_parent


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "trace", help="run a vLLM-harness workload (JSON) with the vllm-v1 policy, step by step")
    t.add_argument("workload", type=Path,
                   help="workload JSON: a request list or {config, requests}")
    t.add_argument("--out", type=Path, required=True,
                   help="trace file to write (JSONL; missing parent directories are created)")
    t.add_argument("--block-tables", action="store_true",
                   help="add each scheduled request's block ids to the trace")
    t.add_argument("--compare", type=Path, metavar="TRACE",
                   help="compare with a reference trace (e.g. the harness's); exit 1 if it differs")
    t.set_defaults(handler=trace)


def trace(args: argparse.Namespace) -> int:
    """Check the inputs and ``--out``, run the workload, write the trace, compare it."""
    from orcasim.steptrace import load_workload, run_trace, write_trace

    out = check_output_file(args.out)
    workload = load_workload(check_input_file(args.workload))
    ref = _reference(args.compare, args.block_tables) if args.compare is not None else None
    lines, summary = run_trace(workload, block_tables=args.block_tables)
    make_parent(out)
    write_trace(out, lines, summary)
    print(f"{args.workload}: {len(workload.requests)} requests, {len(lines)} steps "
          f"(last step {summary['last_step']}), {summary['num_preemptions']} preemptions, "
          f"{summary['ms_per_step']} ms/step; wrote {out}")
    if ref is None:
        return 0
    if args.block_tables and not has_block_tables(ref):
        print("block tables not compared: the reference has none")
        lines = without_block_tables(lines)
    return _compare(lines, ref, args.compare)


def _reference(path: Path, block_tables: bool) -> list[dict[str, Any]]:
    """The reference trace's step lines (without block tables unless ``block_tables``)."""
    from orcasim.errors import UsageError
    from orcasim.steptrace import read_trace

    try:
        ref, _ = read_trace(path)
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or err
        raise UsageError(f"{path}: cannot read the reference trace: {reason}") from None
    if not all(isinstance(line, dict) for line in ref):
        raise UsageError(f"{path}: not a step trace (every line must be a JSON object)")
    return ref if block_tables else without_block_tables(ref)


def has_block_tables(lines: list[dict[str, Any]]) -> bool:
    """Whether any scheduled entry of the trace lists its block ids (``--block-tables``)."""
    return any(isinstance(e, dict) and "blocks" in e
               for line in lines for e in line.get("scheduled", ()))


def without_block_tables(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of the trace lines without block ids, to compare the rest of two traces."""
    return [
        {**line, "scheduled": [
            {k: v for k, v in e.items() if k != "blocks"} if isinstance(e, dict) else e
            for e in line["scheduled"]]}
        if isinstance(line.get("scheduled"), list) else line
        for line in lines
    ]


def _compare(lines: list[dict[str, Any]], ref: list[dict[str, Any]], path: Path) -> int:
    """Print whether ``lines`` match the reference; 0 when they do, 1 when they differ."""
    from orcasim.steptrace import first_difference

    diff = first_difference(lines, ref)
    if diff is None:
        print(f"{len(ref)}/{len(ref)} steps identical to {path}")
        return 0
    print(f"differs from {path}: {diff}")
    return 1

"""``orcasim replay-vllm RUN_DIR --workload W.jsonl --profiles DIR --out OUT``: predict a run.

Builds the scenario of a measured vLLM run from its engine arguments
(:mod:`orcasim.replay.scenario`), simulates the workload the run served, and
compares the prediction with the measurement (:mod:`orcasim.replay.compare`).
Writes to OUT: ``scenario.yaml`` (the scenario it ran: ``orcasim run`` on it
gives the same prediction), ``comparison.csv``, ``requests.csv`` and, unless
``--no-plots``, ``latency_cdf.png`` and ``running_waiting.png``. Prints the
comparison table. Exit status 2 for a missing or malformed run directory,
workload or profile, or a workload that does not match the run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.commands.common import check_output_dir
from orcasim.errors import UsageError

if TYPE_CHECKING:
    from orcasim.metrics.plot_process import PlotProcess


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "replay-vllm", help="predict a measured vLLM run and compare with the measurement",
        description="Simulate the requests of a measured vLLM serving run (RUN_DIR: meta.json, "
        "requests.jsonl, optionally timeseries.csv) with the run's engine arguments and print "
        "measured against predicted TTFT, TPOT and E2E (mean, median, p90, p95, p99).")
    c.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the measured run")
    c.add_argument("--workload", type=Path, required=True, metavar="WORKLOAD.jsonl",
                   help="the request stream the run served, with token ids (input_toks, "
                   "output_toks, arrival_time_ns, input_tok_ids per line)")
    c.add_argument("--profiles", type=Path, default=None, metavar="PROFILE_DIR",
                   help="operator profiles of the GPU and model (meta.yaml, tp<N>/): the "
                   "profile latency model")
    c.add_argument("--gpu", default=None, help="without --profiles: a GPU preset for the "
                   "roofline latency model")
    c.add_argument("--gpu-memory-gb", type=float, default=None, metavar="N",
                   help="the GPU's memory in GiB (2^30 bytes; the datasheet's capacity, e.g. "
                   "24 for an RTX 4090, or the total vLLM logs), to size the KV cache when the run "
                   "records neither its blocks nor its device memory "
                   "(default: the GPU preset the profiles or --gpu name)")
    c.add_argument("--num-gpu-blocks", type=int, default=None, metavar="N",
                   help="KV cache blocks (default: the run's num_gpu_blocks, else sized from "
                   "GPU memory as vLLM does)")
    c.add_argument("--kv-reserve-gb", type=float, default=None, metavar="N",
                   help="memory per GPU vLLM keeps besides weights and KV cache (activation "
                   "peak and non-PyTorch memory), GiB, when the KV cache is sized from memory "
                   "(default: 1.42 GiB)")
    c.add_argument("--overhead-s", type=float, default=None, metavar="S",
                   help="the profile model's fixed CPU time per step, s (default: the "
                   "model's default)")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--no-plots", action="store_true", help="skip the plots")
    c.set_defaults(handler=replay_cmd)


def replay_cmd(args: argparse.Namespace) -> int:
    """Read, check, simulate, compare, write; print the table.

    The plots are drawn by a child process started first, which imports
    matplotlib while this one simulates (:mod:`orcasim.metrics.plot_process`).
    """
    from orcasim.metrics.plot_process import PlotProcess

    if args.no_plots:
        return _replay(args, None)
    with PlotProcess("orcasim.replay.plots") as plotter:
        return _replay(args, plotter)


def _replay(args: argparse.Namespace, plotter: PlotProcess | None) -> int:
    import yaml

    from orcasim.replay import compare
    from orcasim.replay.measured import load_run
    from orcasim.replay.scenario import EngineArgs, build_scenario
    from orcasim.scenario import Scenario
    from orcasim.simulation import simulate
    from orcasim.workload.traces import TraceError, load_trace

    t0 = time.perf_counter()
    if args.gpu_memory_gb is not None and not 0 < args.gpu_memory_gb <= 1e6:
        raise UsageError(f"--gpu-memory-gb must be > 0, got {args.gpu_memory_gb:g}")
    if args.num_gpu_blocks is not None and not 1 <= args.num_gpu_blocks <= 100_000_000:
        raise UsageError(f"--num-gpu-blocks must be between 1 and 100,000,000, got "
                         f"{args.num_gpu_blocks}")
    if args.kv_reserve_gb is not None and not 0 <= args.kv_reserve_gb <= 1e6:
        raise UsageError(f"--kv-reserve-gb must be >= 0, got {args.kv_reserve_gb:g}")
    out = check_output_dir(args.out)
    run = load_run(args.run_dir)
    meta_where = str(args.run_dir / "meta.json")
    if not args.workload.is_file():
        raise UsageError(f"{args.workload}: no such workload file")
    if args.profiles is not None and not args.profiles.is_dir():
        raise UsageError(f"{args.profiles}: no such profile directory")
    block_size = EngineArgs(run.meta, meta_where).positive_int("block_size", 16)
    try:
        trace = load_trace(args.workload.resolve(), "tokens", hash_block_size=block_size)
    except TraceError as err:
        raise UsageError(str(err)) from None
    _check_match(run, trace, args)
    scenario = build_scenario(
        run.meta, meta_where, args.workload.resolve(),
        profiles=args.profiles.resolve() if args.profiles is not None else None,
        gpu=args.gpu, gpu_memory_gb=args.gpu_memory_gb,
        max_request_len=int((trace.prompt_len + trace.output_len).max()),
        num_gpu_blocks_override=args.num_gpu_blocks, kv_reserve_gb=args.kv_reserve_gb)
    kv_line = _kv_line(scenario, run.meta, meta_where, args)
    if args.overhead_s is not None:
        scenario["engine"]["latency"]["overhead_s" if args.profiles else "overhead"] = \
            args.overhead_s
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    res = simulate(Scenario(scenario, source=str(out / "scenario.yaml")))
    variant = next(iter(res.variants.values()))
    predicted = _predicted_ms(variant.columns, variant.series,
                              bool(scenario.get("cluster", {}).get("groups", [{}])[0]
                                   .get("lockstep")))
    measured = run.latencies_ms()
    if plotter is not None:  # the child draws while this process writes the tables
        lat = scenario["engine"]["latency"]["type"]
        title = (f"{run.meta.get('model', 'model')}: {len(run.request_ids)} requests, "
                 f"measured vs predicted ({lat} latency model)")
        plotter.draw("latency_cdfs", out / "latency_cdf.png", measured, predicted, title)
        plotter.draw("running_waiting", out / "running_waiting.png", run.timeseries,
                     variant.series, title)
        plotter.send()
    rows = compare.comparison_rows(measured, predicted)
    compare.write_comparison(out / "comparison.csv", rows)
    compare.write_requests(out / "requests.csv", run.request_ids, measured, predicted)
    written = ["scenario.yaml", "comparison.csv", "requests.csv"]
    if plotter is not None:
        plotter.finish()
        written += ["latency_cdf.png", "running_waiting.png"]
    lat = scenario["engine"]["latency"]["type"]
    print(compare.format_table(rows, f"{args.run_dir}: measured vs predicted ({lat} model), "
                               f"{len(run.request_ids)} requests"))
    print(f"\n{kv_line}")
    print(f"wrote {len(written)} files to {out}/: {', '.join(written)} "
          f"({time.perf_counter() - t0:.2f} s)")
    return 0


def _kv_line(scenario: dict, meta: dict, where: str, args: argparse.Namespace) -> str:
    """One line saying how many KV blocks the replay gives the engine, and from what."""
    from orcasim.kv.config import MemoryOptions, resolve
    from orcasim.replay.scenario import kv_memory

    policy = scenario["policy"]
    if "num_blocks" in policy:
        how = "--num-gpu-blocks" if args.num_gpu_blocks is not None else "the run's record"
        return f"KV cache: {policy['num_blocks']:,} blocks of {policy['block_size']} tokens ({how})"
    mem = scenario["memory"]
    n = resolve(MemoryOptions(**mem)).num_blocks
    _, source = kv_memory(meta, where, gpu_memory_gb=args.gpu_memory_gb, gpu=args.gpu,
                          profiles=args.profiles)
    return (f"KV cache: {n:,} blocks of {mem['block_size']} tokens ({mem['gpu_memory_gb']:.4g} "
            f"GB from {source} x {mem['gpu_memory_utilization']:g} - weights - "
            f"{mem['activation_reserve_gb']:.3g} GB reserve)")


def _check_match(run, trace, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """The workload must be the run's request stream: same count and lengths, line by line."""
    n_run, n_wl = len(run.request_ids), len(trace)
    if n_run != n_wl:
        raise UsageError(f"{args.workload}: {n_wl} requests, but the run "
                         f"({args.run_dir / 'requests.jsonl'}) has {n_run}")
    for name, a, b in (("input_toks", run.input_toks, trace.prompt_len),
                       ("output_toks", run.output_toks, trace.output_len)):
        bad = np.flatnonzero(np.asarray(a) != np.asarray(b))
        if bad.size:
            k = int(bad[0])
            raise UsageError(f"{args.workload}: request {k + 1} has {name} {int(b[k])}, but "
                             f"the run's request {run.request_ids[k]} has {int(a[k])}: the "
                             "workload is not the one the run served")


def _predicted_ms(cols: dict[str, Any], series: dict[str, np.ndarray], lockstep: bool
                  ) -> dict[str, np.ndarray]:
    """Predicted TTFT, TPOT and E2E per request, ms, TTFT and E2E counted from when the
    simulated engine took the request, as vLLM's ``queued_ts`` (:mod:`orcasim.replay.queued`;
    from the arrival if the step series is binned)."""
    from orcasim.metrics.summary import request_latencies
    from orcasim.replay.queued import simulated_queued

    lat = request_latencies(cols)
    queued = simulated_queued(cols, series, lockstep)
    if queued is None:
        queued = cols["arrival"]
    return {"ttft": (cols["first_token"] - queued) * 1e3, "tpot": lat["tpot"] * 1e3,
            "e2e": (cols["finish"] - queued) * 1e3}

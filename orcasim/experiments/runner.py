"""Run a sweep: every grid point times every seed, in parallel, resumable.

Runs are independent tasks handed to joblib: the loky backend uses the
local cores; the dask and ray backends run the same tasks on an existing
cluster (joblib's own backends: no scheduler of ours). The parent process
receives each finished run as soon as it completes and stores it at once
(see :mod:`orcasim.experiments.store`), so an interrupted sweep loses only
the runs in flight and the same call later skips everything already done.
A run that raises is recorded with its error and the others go on.
"""

from __future__ import annotations

import io
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orcasim.errors import OrcasimError
from orcasim.experiments.grid import VARIANT, Task, plan
from orcasim.experiments.store import META_COLUMNS, STATUS_COLUMNS, SweepStore, assemble
from orcasim.scenario import Scenario, VariantConfig, load_scenario

if TYPE_CHECKING:
    import pandas as pd

BACKENDS = ("loky", "dask", "ray")


def execute_run(
    cfg: VariantConfig, seed: int, keep_requests: bool, run_id: str
) -> tuple[str, dict[str, Any], dict[str, bytes]]:
    """Run one configuration with one seed (in a worker): ``(run_id, row, files)``.

    ``row`` has the status, the checks and the summary metrics; ``files`` the
    per-request rows and step series as parquet bytes when ``keep_requests``.
    Any exception is caught and recorded in the row.
    """
    from orcasim.experiments.checks import check_run
    from orcasim.simulation import generate_workload, run_variant

    t0 = time.perf_counter()
    files: dict[str, bytes] = {}
    try:
        arrays = generate_workload(cfg, seed)
        res = run_variant(cfg, arrays, seed=seed)  # the policies' rng follows the seed too
        checks = check_run(res.columns, len(arrays), warmup=cfg.metrics.warmup,
                           cooldown=cfg.metrics.cooldown)
        row: dict[str, Any] = {"status": "ok", "error": "", **checks.as_row(),
                               "metrics": dict(res.summary)}
        if keep_requests:
            files["requests"] = _parquet_bytes(res.requests)
            files["series"] = _parquet_bytes(res.step_series)
    except OrcasimError as err:
        row, files = {"status": "error", "error": str(err)}, {}
    except Exception as err:  # a crashing run is recorded; the sweep goes on
        where = traceback.extract_tb(err.__traceback__)[-1]
        row = {"status": "error", "error": f"{type(err).__name__}: {err} "
               f"({Path(where.filename).name}:{where.lineno})"}
        files = {}
    row["wall_s"] = time.perf_counter() - t0
    return run_id, _json_safe(row), files


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _json_safe(x: Any) -> Any:
    import numpy as np

    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, np.generic):
        return x.item()
    return x


def sweep(
    scenario: Scenario | str | Path | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    *,
    seed: int | None = None,
    n_jobs: int | None = None,
    backend: str = "loky",
    scheduler: str | None = None,
    address: str | None = None,
    keep_requests: int | None = None,
    retry_failed: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Run every point of ``grid`` with ``seeds`` seeds; return the long-format results.

    ``grid`` maps dotted scenario fields (and ``variant``) to value lists and
    is merged over the scenario's ``sweep.grid`` (keys given here win);
    ``seeds``, ``seed`` (the base seed) and ``keep_requests`` default to the
    ``sweep:`` section, then to 1, the scenario's seed and 1. With ``out``,
    each run is stored as it finishes and a repeated call resumes; the table
    is also written to ``out/results.parquet`` and ``out/results.csv``.

    ``backend`` is ``"loky"`` (local processes, ``n_jobs`` of them; default:
    every core), ``"dask"`` (``scheduler``: the address of a running
    ``dask.distributed`` scheduler; default: the current client) or ``"ray"``
    (``address``: a Ray cluster; default ``"auto"``).
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    if backend not in BACKENDS:
        raise OrcasimError(f"unknown backend {backend!r} (one of: {', '.join(BACKENDS)})")
    opts = scenario.model.sweep
    full_grid: dict[str, list[Any]] = dict(opts.grid) if opts is not None else {}
    full_grid.update({k: list(v) for k, v in (grid or {}).items()})
    for k, v in full_grid.items():
        if not v:
            raise OrcasimError(f"grid {k}: needs at least one value")
        if k in META_COLUMNS or k in STATUS_COLUMNS:
            hint = " (use --seeds and --seed for seeds)" if k == "seed" else ""
            raise OrcasimError(f"grid {k}: the results table has a column of that name{hint}")
    n_seeds = seeds if seeds is not None else (opts.seeds if opts is not None else 1)
    if n_seeds < 1:
        raise OrcasimError(f"seeds must be >= 1 (got {n_seeds})")
    base = seed if seed is not None else (
        opts.seed if opts is not None and opts.seed is not None else scenario.seed)
    keep = keep_requests if keep_requests is not None else (
        opts.keep_requests if opts is not None else 1)
    if out is None:
        keep = 0
    points, tasks = plan(scenario, full_grid, n_seeds, base, keep)
    params = list(points[0].params) if points else [VARIANT]
    store = SweepStore(out) if out is not None else None
    t_start = time.time()
    manifest = {
        "scenario": scenario.name,
        "source": scenario.source,
        "description": scenario.model.description,
        "overrides": [[k, v] for k, v in scenario.overrides],
        "grid": {k: list(v) for k, v in full_grid.items()},
        "params": params,
        "seeds": n_seeds,
        "base_seed": base,
        "keep_requests": keep,
        "points": [{"point_id": p.point_id, **p.params} for p in points],
        "num_runs": len(tasks),
    }
    memory: dict[str, dict[str, Any]] = {}
    if store is not None:
        store.prepare()
        store.write_manifest(manifest)
        todo = [t for t in tasks if not t.error and not store.is_done(t, retry_failed)]
    else:
        todo = [t for t in tasks if not t.error]
    num_invalid = sum(1 for t in tasks if t.error)
    stats = {"total": len(tasks), "computed": 0, "reused": len(tasks) - len(todo) - num_invalid,
             "invalid": num_invalid, "failed": 0}
    interrupted: BaseException | None = None
    try:
        with _progress(tasks, todo, progress) as tick:
            for run_id, row, files in _execute(todo, n_jobs, backend, scheduler, address):
                if store is not None:
                    store.write_run(run_id, row, files)
                else:
                    memory[run_id] = row
                stats["computed"] += 1
                stats["failed"] += row["status"] != "ok"
                tick(run_id)
    except (KeyboardInterrupt, OrcasimError) as err:
        interrupted = err
    df = assemble(tasks, params, store.load_run if store is not None else memory.get)
    df.attrs["sweep"] = {**stats, "wall_s": time.time() - t_start, "out": str(out)}
    if store is not None:
        store.write_table(df)
        manifest["last_invocation"] = df.attrs["sweep"]
        store.write_manifest(manifest)
    if interrupted is not None:
        if isinstance(interrupted, OrcasimError) and store is not None:
            raise OrcasimError(f"{interrupted}; {len(df)} of {len(tasks)} runs are saved in "
                               f"{out}: run the same sweep again to resume") from None
        raise interrupted
    return df


@contextmanager
def _progress(tasks: list[Task], todo: list[Task], enabled: bool) -> Iterator[Any]:
    """A tqdm bar over runs, with the number of finished points and an ETA."""
    from tqdm.auto import tqdm

    remaining: dict[str, int] = {}
    for t in todo:
        remaining[t.point.point_id] = remaining.get(t.point.point_id, 0) + 1
    point_of = {t.run_id: t.point.point_id for t in todo}
    num_points = len({t.point.point_id for t in tasks})
    done_points = num_points - len(remaining)
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), unit="run", desc="sweep",
               disable=not enabled, file=sys.stderr, dynamic_ncols=True)
    bar.set_postfix_str(f"points {done_points}/{num_points}")

    def tick(run_id: str) -> None:
        nonlocal done_points
        pid = point_of.get(run_id)
        if pid is not None and pid in remaining:
            remaining[pid] -= 1
            if remaining[pid] == 0:
                del remaining[pid]
                done_points += 1
        bar.set_postfix_str(f"points {done_points}/{num_points}", refresh=False)
        bar.update(1)

    try:
        yield tick
    finally:
        bar.close()


def _execute(
    todo: list[Task], n_jobs: int | None, backend: str, scheduler: str | None,
    address: str | None,
) -> Iterator[tuple[str, dict[str, Any], dict[str, bytes]]]:
    """Yield ``(run_id, row, files)`` for every task, in completion order.

    Backends that cannot stream results (joblib's Ray backend returns a list)
    get the tasks in chunks of a few per worker, so an interruption loses at
    most one chunk.
    """
    if not todo:
        return
    import joblib

    jobs = n_jobs if n_jobs is not None else -1

    def calls(tasks: list[Task]) -> Iterator[Any]:
        return (joblib.delayed(execute_run)(t.cfg, t.seed, t.keep_requests, t.run_id)
                for t in tasks)

    if backend == "loky" and (jobs == 1 or (jobs == -1 and (os.cpu_count() or 1) == 1)):
        for t in todo:  # no worker processes for a serial sweep
            yield execute_run(t.cfg, t.seed, t.keep_requests, t.run_id)  # type: ignore[arg-type]
        return
    with ExitStack() as stack:
        stack.enter_context(_cluster(backend, scheduler, address))
        if backend != "loky":
            stack.enter_context(joblib.parallel_config(backend=backend))
        kw: dict[str, Any] = {"backend": "loky"} if backend == "loky" else {}
        try:
            try:
                par = joblib.Parallel(n_jobs=jobs, return_as="generator_unordered", **kw)
            except ValueError:  # the backend cannot stream: chunks
                chunk = 4 * joblib.effective_n_jobs(jobs)
                par = joblib.Parallel(n_jobs=jobs, return_as="list", **kw)
                for i in range(0, len(todo), chunk):
                    yield from par(calls(todo[i : i + chunk]))
                return
            yield from par(calls(todo))
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except Exception as err:  # a worker or the cluster went away
            raise OrcasimError(f"the {backend} backend failed: {type(err).__name__}: "
                               f"{_first_line(err)}") from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


@contextmanager
def _cluster(backend: str, scheduler: str | None, address: str | None) -> Iterator[None]:
    """Connect to the cluster a backend needs (nothing for loky)."""
    if backend == "dask":
        try:
            from distributed import Client, get_client
        except ImportError:
            raise OrcasimError("the dask backend needs dask.distributed: "
                               "pip install 'orcasim[dask]'") from None
        if scheduler is None:
            try:
                get_client()
            except ValueError:
                raise OrcasimError("the dask backend needs --scheduler tcp://HOST:8786 "
                                   "(or a running distributed.Client)") from None
            yield
            return
        try:
            client = Client(scheduler, timeout=30)
        except OSError as err:
            raise OrcasimError(f"cannot reach the dask scheduler {scheduler}: {err}") from None
        try:
            yield
        finally:
            client.close()
    elif backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise OrcasimError("the ray backend needs ray: pip install 'orcasim[ray]'") from None
        started = not ray.is_initialized()
        if started:
            ray.init(address=address or "auto")
        register_ray()
        try:
            yield
        finally:
            if started:
                ray.shutdown()
    else:
        yield

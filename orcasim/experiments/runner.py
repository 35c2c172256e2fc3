"""Run a sweep: every grid point times every seed, in parallel, resumable.

Runs are independent tasks handed to joblib: the loky backend uses the
local cores; the dask and ray backends run the same tasks on an existing
cluster (joblib's own backends: no scheduler of ours). The parent process
receives each finished run as soon as it completes and stores it at once
(see :mod:`orcasim.experiments.store`), so an interrupted sweep loses only
the runs in flight and the same call later skips everything already done.
A run that raises is recorded with its error and the others go on; the
call then warns (:class:`~orcasim.errors.FailedRunsWarning`).

Everything a user can get wrong is checked before the output directory is
created or any run starts: the arguments, the output location, and the
configuration of every grid point (a :class:`~orcasim.errors.ScenarioError`
naming the grid key and value).
"""

from __future__ import annotations

import io
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orcasim.errors import FailedRunsWarning, OrcasimError, ScenarioError, UsageError
from orcasim.experiments.grid import VARIANT, Task, check_grid, plan
from orcasim.experiments.store import (
    META_COLUMNS,
    STATUS_COLUMNS,
    SweepStore,
    assemble,
    first_line,
)
from orcasim.plugins import with_plugins
from orcasim.scenario import Scenario, VariantConfig, load_scenario

if TYPE_CHECKING:
    import pandas as pd

BACKENDS = ("loky", "dask", "ray")

#: what a finished run sends back: ``(run_id, row, files)``
RunResult = tuple[str, dict[str, Any], dict[str, bytes]]


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
    _check_args(backend, n_jobs, seeds, seed, keep_requests)
    if out is not None:
        from orcasim.commands.common import check_output_dir

        check_output_dir(out, "out")
    opts = scenario.model.sweep
    full_grid: dict[str, list[Any]] = dict(opts.grid) if opts is not None else {}
    full_grid.update({k: list(v) for k, v in (grid or {}).items()})
    _check_keys(full_grid)
    n_seeds = seeds if seeds is not None else (opts.seeds if opts is not None else 1)
    base = seed if seed is not None else (
        opts.seed if opts is not None and opts.seed is not None else scenario.seed)
    keep = keep_requests if keep_requests is not None else (
        opts.keep_requests if opts is not None else 1)
    if out is None:
        keep = 0
    points, tasks = plan(scenario, full_grid, n_seeds, base, keep)
    manifest = {
        "scenario": scenario.name,
        "source": scenario.source,
        "description": scenario.model.description,
        "overrides": [[k, v] for k, v in scenario.overrides],
        "grid": {k: list(v) for k, v in full_grid.items()},
        "params": list(points[0].params) if points else [VARIANT],
        "seeds": n_seeds,
        "base_seed": base,
        "keep_requests": keep,
        "points": [{"point_id": p.point_id, **p.params} for p in points],
        "num_runs": len(tasks),
    }
    store = SweepStore(out) if out is not None else None
    todo = [t for t in tasks if store is None or not store.is_done(t, retry_failed)]
    with _cluster(backend, scheduler, address) if todo else nullcontext():
        if store is not None:
            store.prepare()
            store.write_manifest(manifest)
        df = _run(tasks, todo, manifest, store, progress,
                  lambda todo: _execute(todo, n_jobs, backend, scheduler, address))
    _warn_failed(df)
    return df


def _run(
    tasks: list[Task], todo: list[Task], manifest: dict[str, Any], store: SweepStore | None,
    progress: bool, execute: Callable[[list[Task]], Iterator[RunResult]],
) -> pd.DataFrame:
    """Run ``todo``, storing each run as it finishes; the table of every task that is done.

    An interruption (Ctrl-C, a backend that fails) still writes the table of
    what finished, then propagates.
    """
    t_start = time.time()
    memory: dict[str, dict[str, Any]] = {}
    stats = {"total": len(tasks), "computed": 0, "reused": len(tasks) - len(todo), "failed": 0}
    interrupted: BaseException | None = None
    try:
        with _progress(tasks, todo, progress) as tick:
            for run_id, row, files in execute(todo):
                if store is not None:
                    store.write_run(run_id, row, files)
                else:
                    memory[run_id] = row
                stats["computed"] += 1
                stats["failed"] += row["status"] != "ok"
                tick(run_id)
    except (KeyboardInterrupt, OrcasimError) as err:
        interrupted = err
    params = manifest["params"]
    df = assemble(tasks, params, store.load_run if store is not None else memory.get)
    df.attrs["sweep"] = {**stats, "wall_s": time.time() - t_start,
                         "out": str(store.root) if store is not None else "None"}
    if store is not None:
        store.write_table(df)
        manifest["last_invocation"] = df.attrs["sweep"]
        store.write_manifest(manifest)
    if interrupted is not None:
        if isinstance(interrupted, OrcasimError) and store is not None:
            raise OrcasimError(f"{interrupted}; {len(df)} of {len(tasks)} runs are saved in "
                               f"{store.root}: run the same sweep again to resume") from None
        raise interrupted
    return df


def _check_args(
    backend: str, n_jobs: int | None, seeds: int | None, seed: int | None,
    keep_requests: int | None,
) -> None:
    """The arguments of :func:`sweep` that do not depend on the scenario."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} (one of: {', '.join(BACKENDS)})")
    if n_jobs is not None and n_jobs < 1 and n_jobs != -1:
        raise UsageError(f"n_jobs must be >= 1, or -1 for every core (got {n_jobs})")
    if seeds is not None and seeds < 1:
        raise UsageError(f"seeds must be >= 1 (got {seeds})")
    if seed is not None and seed < 0:
        raise UsageError(f"the base seed must be >= 0 (got {seed})")
    if keep_requests is not None and keep_requests < 0:
        raise UsageError(f"keep_requests must be >= 0 (got {keep_requests})")


def _check_keys(grid: dict[str, list[Any]]) -> None:
    """Grid keys that are not columns of the results table; values given once each."""
    for k in grid:
        if k in META_COLUMNS or k in STATUS_COLUMNS:
            hint = " (use --seeds and --seed for seeds)" if k == "seed" else ""
            raise ScenarioError(f"grid {k}", f"the results table has a column of that name{hint}")
    check_grid(grid)


def _warn_failed(df: pd.DataFrame) -> None:
    """A :class:`FailedRunsWarning` when some runs of ``df`` failed, with the first error."""
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        warnings.warn(f"{len(bad)} of {len(df)} runs failed, e.g. run {bad['run_id'].iloc[0]}: "
                      f"{bad['error'].iloc[0]}", FailedRunsWarning, stacklevel=3)


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
    run = with_plugins(execute_run)  # workers import the plugins before unpickling a task

    def calls(tasks: list[Task]) -> Iterator[Any]:
        return (joblib.delayed(run)(t.cfg, t.seed, t.keep_requests, t.run_id)
                for t in tasks)

    if backend == "loky" and (jobs == 1 or (jobs == -1 and (os.cpu_count() or 1) == 1)):
        for t in todo:  # no worker processes for a serial sweep
            yield execute_run(t.cfg, t.seed, t.keep_requests, t.run_id)  # type: ignore[arg-type]
        return
    with ExitStack() as stack:
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
                               f"{first_line(err)}") from err


@contextmanager
def _cluster(backend: str, scheduler: str | None, address: str | None) -> Iterator[None]:
    """Connect to the cluster a backend needs (nothing for loky)."""
    if backend == "dask":
        try:
            from distributed import Client, get_client
        except ImportError:
            raise UsageError("the dask backend needs dask.distributed: "
                               "pip install 'orcasim[dask]'") from None
        if scheduler is None:
            try:
                get_client()
            except ValueError:
                raise UsageError("the dask backend needs --scheduler tcp://HOST:8786 "
                                   "(or a running distributed.Client)") from None
            yield
            return
        try:
            client = Client(scheduler, timeout=30)
        except OSError as err:
            raise UsageError(f"cannot reach the dask scheduler {scheduler}: {err}") from None
        try:
            yield
        finally:
            client.close()
    elif backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise UsageError("the ray backend needs ray: pip install 'orcasim[ray]'") from None
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

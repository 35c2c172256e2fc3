"""A sweep's directory: one small file per finished run, then one table.

::

    DIR/sweep.json                     what was swept (grid, seeds, points)
    DIR/runs/<run_id>.json             one finished run: its summary row
    DIR/runs/<run_id>.requests.parquet per-request rows (the first replications only)
    DIR/runs/<run_id>.series.parquet   batch size / queue length over time (same runs)
    DIR/results.parquet, results.csv   every run, one row each (assembled)

Every file is written to a temporary name and renamed into place, so a
killed sweep leaves only whole files; a run counts as done when its JSON
exists (written last). Re-running skips done runs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from orcasim.experiments.grid import Task

#: columns that describe a run rather than measure it
META_COLUMNS = ("run_id", "point_id", "seed", "rep")
STATUS_COLUMNS = (
    "status",
    "error",
    "wall_s",
    "check_conservation",
    "check_little",
    "little_L",
    "little_lambda_W",
    "little_rel_err",
    "check_warnings",
)


#: keys every sweep.json has (what reports and comparisons read)
MANIFEST_KEYS = ("scenario", "source", "grid", "params", "seeds", "base_seed", "points",
                 "num_runs")


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SweepStore:
    """Reads and writes one sweep directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.runs = self.root / "runs"

    def prepare(self) -> None:
        """Create the folders and remove temporary files a killed sweep left behind."""
        self.runs.mkdir(parents=True, exist_ok=True)
        for p in [*self.runs.glob(".*.tmp"), *self.root.glob(".*.tmp")]:
            with contextlib.suppress(OSError):
                p.unlink()

    # -- runs ---------------------------------------------------------------
    def run_path(self, run_id: str, kind: str = "json") -> Path:
        suffix = ".json" if kind == "json" else f".{kind}.parquet"
        return self.runs / f"{run_id}{suffix}"

    def load_run(self, run_id: str) -> dict[str, Any] | None:
        """The stored row of a run, or None when it is not done (or unreadable)."""
        p = self.run_path(run_id)
        try:
            row = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        return row if isinstance(row, dict) else None

    def is_done(self, task: Task, retry_failed: bool = False) -> bool:
        """Whether ``task`` has a stored result (with its per-request rows when it keeps them)."""
        row = self.load_run(task.run_id)
        if row is None:
            return False
        if retry_failed and row.get("status") != "ok":
            return False
        if task.keep_requests and row.get("status") == "ok":
            return self.run_path(task.run_id, "requests").exists()
        return True

    def write_run(self, run_id: str, row: dict[str, Any], files: dict[str, bytes]) -> None:
        """Store a finished run: its parquet files first, the JSON (the done marker) last."""
        for kind, data in files.items():
            atomic_write(self.run_path(run_id, kind), data)
        atomic_write(self.run_path(run_id), (json.dumps(row) + "\n").encode())

    # -- the sweep ----------------------------------------------------------
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write(self.root / "sweep.json", (json.dumps(manifest, indent=2, default=str)
                                                + "\n").encode())

    def manifest(self) -> dict[str, Any]:
        """The sweep's ``sweep.json``; a :class:`UsageError` when ``root`` is not a sweep."""
        from orcasim.errors import UsageError

        if not self.root.is_dir():
            what = "it does not exist" if not self.root.exists() else "not a directory"
            raise UsageError(f"{self.root}: not a sweep directory ({what})")
        p = self.root / "sweep.json"
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise UsageError(f"{self.root}: not a sweep directory (no sweep.json)") from None
        except (OSError, ValueError) as err:
            raise UsageError(f"{p}: cannot read: {getattr(err, 'strerror', None) or err}") from None
        missing = [k for k in MANIFEST_KEYS if not isinstance(data, dict) or k not in data]
        if missing:
            raise UsageError(f"{p}: not a sweep manifest (no {missing[0]!r})")
        return data  # type: ignore[no-any-return]

    def assemble(self, tasks: Iterable[Task], params: list[str]) -> pd.DataFrame:
        """The long-format table of every run of ``tasks`` that is done."""
        return assemble(tasks, params, self.load_run)

    def write_table(self, df: pd.DataFrame) -> list[Path]:
        """Write results.parquet and results.csv atomically."""
        import io

        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        pq = self.root / "results.parquet"
        atomic_write(pq, buf.getvalue())
        csv = self.root / "results.csv"
        atomic_write(csv, df.to_csv(index=False).encode())
        return [pq, csv]

    def results(self) -> pd.DataFrame:
        """The assembled table (results.parquet)."""
        import pandas as pd

        from orcasim.errors import UsageError

        p = self.root / "results.parquet"
        if not p.exists():
            raise UsageError(f"{self.root}: no results.parquet (run `orcasim sweep` first)")
        try:
            df = pd.read_parquet(p)
        except (OSError, ValueError) as err:
            raise UsageError(f"{p}: cannot read: {first_line(err)}") from None
        missing = [c for c in (*META_COLUMNS, *STATUS_COLUMNS) if c not in df.columns]
        if missing:
            raise UsageError(f"{p}: not a sweep's results table (no column {missing[0]!r})")
        return df

    def requests(self, run_id: str) -> pd.DataFrame | None:
        """The kept per-request rows of a run, or None."""
        return self._parquet(run_id, "requests")

    def series(self, run_id: str) -> pd.DataFrame | None:
        """The kept step series of a run, or None."""
        return self._parquet(run_id, "series")

    def _parquet(self, run_id: str, kind: str) -> pd.DataFrame | None:
        import pandas as pd

        p = self.run_path(run_id, kind)
        return pd.read_parquet(p) if p.exists() else None


def assemble(
    tasks: Iterable[Task], params: list[str], load: Callable[[str], dict[str, Any] | None]
) -> pd.DataFrame:
    """The long-format table of every run of ``tasks`` that ``load(run_id)`` finds."""
    import pandas as pd

    rows = []
    metric_order: dict[str, None] = {}
    for t in tasks:
        stored = load(t.run_id)
        if stored is None:
            continue
        row: dict[str, Any] = {"run_id": t.run_id, "point_id": t.point.point_id,
                               "seed": t.seed, "rep": t.rep}
        row.update({k: t.point.params[k] for k in params})
        for k in STATUS_COLUMNS:
            row[k] = stored.get(k)
        metrics = stored.get("metrics") or {}
        for k in metrics:
            metric_order.setdefault(k, None)
        row.update(metrics)
        rows.append(row)
    cols = [*META_COLUMNS, *params, *STATUS_COLUMNS, *metric_order]
    df = pd.DataFrame(rows, columns=cols)
    for k in params:
        df[k] = _uniform(df[k])
    df["error"] = df["error"].fillna("").astype(str)
    df["check_warnings"] = df["check_warnings"].fillna("").astype(str)
    for k in ("check_conservation", "check_little"):
        df[k] = df[k].astype("boolean")
    return df


def _uniform(col: pd.Series) -> pd.Series:
    """A parameter column with one type: numbers stay numbers, anything else becomes text."""
    import pandas as pd

    vals = col.tolist()
    if all(isinstance(v, bool) for v in vals):
        return col.astype(bool)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return pd.to_numeric(col)
    return col.map(lambda v: v if isinstance(v, str) else json.dumps(v, default=str))


def load_sweep(path: str | Path) -> pd.DataFrame:
    """The results table of the sweep stored in ``path`` (``results.parquet``)."""
    return SweepStore(path).results()

"""Results of a run: per-request rows, step series and summaries, as pandas DataFrames.

The simulation hands over plain numpy columns; pandas is imported only when a
DataFrame is asked for, so the simulator itself never depends on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.metrics.plot_process import takes_results
from orcasim.metrics.request_table import (
    head,
    request_table,
    request_tables,
    write_requests_parquet,
)
from orcasim.metrics.result_format import (
    default_metrics,
    escape,
    existing_files,
    fmt,
    headline,
    html_tables,
    jsonable,
    metric_unit,
    note_overwritten,
    pd_frame,
    split_summary_key,
)
from orcasim.metrics.row_spill import SpilledColumns
from orcasim.metrics.summary import extra_percentiles, merge_percentiles

if TYPE_CHECKING:
    import pandas as pd

    from orcasim.metrics.plot_process import PlotProcess
    from orcasim.scenario import Scenario, VariantConfig



@dataclass(repr=False)
class VariantResult:
    """One variant's output."""

    name: str
    config: VariantConfig
    #: per-request columns in id order: a dict, or for a run of more than
    #: ``row_spill.STREAM_ABOVE`` requests :class:`SpilledColumns` (read back from disk)
    columns: Mapping[str, Any]
    itl: tuple[np.ndarray, np.ndarray]
    series: dict[str, np.ndarray]
    steps: list[tuple[int, float, float, tuple[str | None, ...]]] | None
    summary: dict[str, float]
    kv_series: dict[str, np.ndarray] | None = None  # KV memory use over time (memory runs)
    routing: dict[str, Any] | None = None  # a cluster's routing log (cluster.routing_log)
    scaling: dict[str, Any] | None = None  # a cluster's scale-up/down timeline (autoscaling)

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request, with its latencies (NaN where undefined).

        A run that streamed its rows to disk (more than ``row_spill.STREAM_ABOVE``
        requests) builds the frame from its file, a million rows at a time.
        """
        return self.first_requests(None)

    def first_requests(self, n: int | None) -> pd.DataFrame:
        """:attr:`requests` of the ``n`` requests with the smallest ids (all with ``None``),
        built from those rows only (the columns of ``requests.parquet``)."""
        if isinstance(self.columns, SpilledColumns) and n is None:  # read back chunk by chunk
            import pyarrow as pa

            return pa.concat_tables(list(request_tables(self.columns))).to_pandas()
        return request_table(head(self.columns, n)).to_pandas()

    @property
    def by_class(self) -> dict[str, dict[str, float]]:
        """The per-class summary: class -> metric -> value (from the ``class.*`` keys)."""
        from orcasim.metrics.groups import split_groups

        return split_groups(self.summary, "class")

    @property
    def step_series(self) -> pd.DataFrame:
        """The bounded per-step series (time-binned for long runs)."""
        import pandas as pd

        return pd.DataFrame(self.series)

    @property
    def kv_usage(self) -> pd.DataFrame | None:
        """KV memory use over time in token slots (time-binned for long runs), if modelled."""
        if self.kv_series is None:
            return None
        import pandas as pd

        return pd.DataFrame(self.kv_series)

    @property
    def step_table(self) -> pd.DataFrame | None:
        """Every step with the requests in its batch, when the run traced steps."""
        if self.steps is None:
            return None
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "step": i + 1,
                    "t_start": t0,
                    "t_end": t1,
                    "batch_size": sum(x is not None for x in labels),
                    "request_ids": " ".join(x for x in labels if x is not None),
                    "slots": " | ".join(x if x is not None else "empty" for x in labels),
                }
                for i, t0, t1, labels in self.steps
            ]
        )

    def add_percentiles(self, qs: Sequence[float]) -> None:
        """Add ``<metric>_p<q>`` summary keys for percentiles ``qs`` beyond p50/p90/p99.

        Existing keys and values stay as they are; see
        :func:`orcasim.metrics.summary.extra_percentiles` for what is covered.
        """
        m = self.config.metrics
        extra = extra_percentiles(self.columns, self.itl, qs, warmup=m.warmup,
                                  cooldown=m.cooldown)
        self.summary = merge_percentiles(self.summary, extra)

    def vllm_bench(self, percentiles: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
        """This variant under ``vllm bench serve``'s result keys and units (ms, tok/s, req/s)."""
        from orcasim.metrics.vocabulary import vllm_bench_metrics

        return vllm_bench_metrics(self, percentiles)

    def __repr__(self) -> str:
        """``VariantResult('continuous': 500 requests, 500 finished; throughput_tok_s ...)``."""
        return f"VariantResult({self.name!r}: {headline(self.summary)})"

    def _repr_html_(self) -> str:
        """This variant's comparison table (``orcasim run``'s metrics) as HTML, for notebooks."""
        return html_tables({self.name: self})

    def format_steps(self) -> str:
        """The per-step schedule in the form ``step 3: C | B`` (one line per step)."""
        if self.steps is None:
            raise ValueError("this run did not trace steps (simulate(..., trace_steps=True))")
        lines = []
        for i, _, _, labels in self.steps:
            lines.append(f"step {i + 1}: " + " | ".join(x if x is not None else "empty"
                                                          for x in labels))
        return "\n".join(lines)


class Results(Mapping[str, VariantResult]):
    """All variants of one scenario run, keyed by variant name."""

    def __init__(self, scenario: Scenario, variants: dict[str, VariantResult], seed: int) -> None:
        self.scenario = scenario
        self.variants = variants
        self.seed = seed

    def __getitem__(self, name: str) -> VariantResult:
        return self.variants[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.variants)

    def __len__(self) -> int:
        return len(self.variants)

    def __repr__(self) -> str:
        """The scenario, seed and variants, each with its request counts and headline metrics."""
        head = (f"Results(scenario {self.scenario.name!r}, seed {self.seed}, "
                f"{len(self.variants)} variant(s): {', '.join(self.variants)})")
        width = max((len(n) for n in self.variants), default=0)
        lines = [f"  {n + ':':<{width + 1}} {headline(v.summary)}"
                 for n, v in self.variants.items()]
        return "\n".join([head, *lines])

    def _repr_html_(self) -> str:
        """The comparison table ``orcasim run`` prints (and per-class/tenant tables) as HTML."""
        caption = (f"<p><b>{escape(self.scenario.name)}</b>, seed {self.seed}, "
                   f"variants: {escape(', '.join(self.variants))}</p>")
        return caption + html_tables(self.variants)

    def default_metrics(self) -> list[str]:
        """The metrics of ``orcasim run``'s comparison table that these results have."""
        return default_metrics(self.variants)

    @property
    def summary(self) -> dict[str, dict[str, float]]:
        """``variant -> metric -> value``."""
        return {name: dict(v.summary) for name, v in self.variants.items()}

    @property
    def requests(self) -> pd.DataFrame:
        """Per-request rows of every variant, with a ``variant`` column first."""
        import pandas as pd

        frames = [v.requests.assign(variant=name) for name, v in self.variants.items()]
        df = pd.concat(frames, ignore_index=True)
        return df[["variant", *[c for c in df.columns if c != "variant"]]]

    @property
    def by_class(self) -> dict[str, dict[str, float]]:
        """The per-class summary: class -> metric -> value (from the ``class.*`` keys)."""
        from orcasim.metrics.groups import split_groups

        return split_groups(self.summary, "class")

    @property
    def step_series(self) -> pd.DataFrame:
        import pandas as pd

        frames = [v.step_series.assign(variant=name) for name, v in self.variants.items()]
        df = pd.concat(frames, ignore_index=True)
        return df[["variant", *[c for c in df.columns if c != "variant"]]]

    @property
    def steps(self) -> pd.DataFrame | None:
        import pandas as pd

        frames = [
            t.assign(variant=name)
            for name, v in self.variants.items()
            if (t := v.step_table) is not None
        ]
        if not frames:
            return None
        df = pd.concat(frames, ignore_index=True)
        return df[["variant", *[c for c in df.columns if c != "variant"]]]

    def add_percentiles(self, qs: Sequence[float]) -> None:
        """Add ``<metric>_p<q>`` summary keys for percentiles ``qs`` to every variant."""
        for v in self.variants.values():
            v.add_percentiles(qs)

    def vllm_bench(
        self, percentiles: Sequence[float] = (50, 90, 99)
    ) -> dict[str, dict[str, float]]:
        """``variant -> vllm bench serve result keys`` (see :mod:`orcasim.metrics.vocabulary`)."""
        return {name: v.vllm_bench(percentiles) for name, v in self.variants.items()}

    def tidy(self) -> pd.DataFrame:
        """The summary as a long table: one row per variant and summary key.

        Columns ``variant, group_kind, group, metric, value, unit``: a
        ``class.<name>.<metric>`` or ``tenant.<name>.<metric>`` key becomes
        ``group_kind`` class/tenant, ``group`` <name> and ``metric`` <metric>;
        run-wide keys have ``group_kind`` and ``group`` None. Long tables
        concatenate across runs and feed plotting and SQL tools directly.
        """
        import pandas as pd

        rows = [
            (name, *split_summary_key(key), value)
            for name, v in self.variants.items()
            for key, value in v.summary.items()
        ]
        df = pd.DataFrame(rows, columns=["variant", "group_kind", "group", "metric", "value"],
                          dtype=object)
        df["value"] = df["value"].astype("float64")
        df["unit"] = pd.Series([metric_unit(m) for m in df["metric"]], index=df.index,
                               dtype=object)
        return df

    def write_vllm_bench(self, out_dir: str | Path,
                         percentiles: Sequence[float] = (50, 90, 99)) -> Path:
        """Write ``summary_vllm.json`` (variant -> vllm bench serve keys); return its path."""
        p = Path(out_dir) / "summary_vllm.json"
        p.write_text(json.dumps(jsonable(self.vllm_bench(percentiles)), indent=2) + "\n")
        return p

    def summary_frame(self) -> pd.DataFrame:
        """Metrics as rows, variants as columns."""
        import pandas as pd

        return pd.DataFrame(self.summary)

    def table(self, metrics: list[str] | None = None) -> str:
        """A plain-text comparison table of the variants."""
        names = list(self.variants)
        keys = metrics or list(next(iter(self.variants.values())).summary)
        width = max(len(k) for k in keys)
        colw = max(12, *(len(n) for n in names))
        lines = [f"{'metric':<{width}}  " + "  ".join(f"{n:>{colw}}" for n in names)]
        for k in keys:
            cells = [fmt(self.variants[n].summary.get(k, float("nan"))) for n in names]
            lines.append(f"{k:<{width}}  " + "  ".join(f"{c:>{colw}}" for c in cells))
        return "\n".join(lines)

    def write(self, out_dir: str | Path, *, plots: bool = True, requests_csv: bool = False,
              plotter: PlotProcess | None = None) -> list[Path]:
        """Write summary.json, summary_long.csv (and .parquet), requests.parquet, series.csv
        (and kv.csv, steps.csv, plots; requests.csv with ``requests_csv``); return the paths.

        A ``plotter`` for ``orcasim.metrics.plots`` draws the plots (in its
        child process, while this one writes the other files).
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        before = existing_files(out)
        written = self._write_files(out, plots, requests_csv, plotter)
        note_overwritten(out, before, written)
        return written

    def _write_files(self, out: Path, plots: bool, requests_csv: bool = False,
                     plotter: PlotProcess | None = None) -> list[Path]:
        """Write every output file into ``out`` (which exists); return the paths."""
        if plotter is not None and not (plots and takes_results(self)):
            plotter.close()
            plotter = None
        if plots and plotter is not None:
            plotter.draw("write_all", self, out)
            plotter.send()
        written = []
        summary = {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "variants": self.summary,
            "config": {n: v.config.to_dict() for n, v in self.variants.items()},
        }
        p = out / "summary.json"
        p.write_text(json.dumps(jsonable(summary), indent=2) + "\n")
        written.append(p)
        written += self._write_tidy(out)
        p = out / "requests.parquet"
        write_requests_parquet(p, (t for n, v in self.variants.items()
                                   for t in request_tables(v.columns, n)),
                               [v.columns for v in self.variants.values()])
        written.append(p)
        if requests_csv:
            p = out / "requests.csv"
            self.requests.to_csv(p, index=False)
            written.append(p)
        p = out / "series.csv"
        self.step_series.to_csv(p, index=False)
        written.append(p)
        kv = [u.assign(variant=n) for n, v in self.variants.items()
              if (u := v.kv_usage) is not None]
        if kv:
            import pandas as pd

            p = out / "kv.csv"
            df = pd.concat(kv, ignore_index=True)
            df[["variant", *[c for c in df.columns if c != "variant"]]].to_csv(p, index=False)
            written.append(p)
        for kind in ("routing", "scaling"):  # cluster runs: routing log, scaling timeline
            frames = [pd_frame(getattr(v, kind)).assign(variant=n)
                      for n, v in self.variants.items() if getattr(v, kind) is not None]
            if frames:
                import pandas as pd

                p = out / f"{kind}.csv"
                df = pd.concat(frames, ignore_index=True)
                df[["variant", *[c for c in df.columns if c != "variant"]]].to_csv(p,
                                                                                  index=False)
                written.append(p)
        steps = self.steps
        if steps is not None:
            p = out / "steps.csv"
            steps.to_csv(p, index=False)
            written.append(p)
        if plots and plotter is not None:
            written += plotter.finish()[0]
        elif plots:
            from orcasim.metrics import plots as plotting

            written += plotting.write_all(self, out)
        return written

    def _write_tidy(self, out: Path) -> list[Path]:
        """``summary_long.csv``, and ``summary_long.parquet`` when pyarrow is installed."""
        df = self.tidy()
        p = out / "summary_long.csv"
        df.to_csv(p, index=False)
        written = [p]
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return written
        p = out / "summary_long.parquet"
        df.to_parquet(p, index=False)
        written.append(p)
        return written

"""Results of a run: per-request rows, step series and summaries, as pandas DataFrames.

The simulation hands over plain numpy columns; pandas is imported only when a
DataFrame is asked for, so the simulator itself never depends on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.metrics.summary import request_latencies
from orcasim.request import RequestState

if TYPE_CHECKING:
    import pandas as pd

    from orcasim.scenario import Scenario, VariantConfig

_STATE_NAMES = {int(s): s.name.lower() for s in RequestState}


@dataclass
class VariantResult:
    """One variant's output."""

    name: str
    config: VariantConfig
    columns: dict[str, Any]
    itl: tuple[np.ndarray, np.ndarray]
    series: dict[str, np.ndarray]
    steps: list[tuple[int, float, float, tuple[str | None, ...]]] | None
    summary: dict[str, float]
    kv_series: dict[str, np.ndarray] | None = None  # KV memory use over time (memory runs)

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request, with its latencies (NaN where undefined)."""
        import pandas as pd

        c = self.columns
        df = pd.DataFrame(
            {
                "id": c["id"],
                "name": [n if n is not None else str(i) for n, i in zip(c["name"], c["id"],
                                                                        strict=True)],
                "arrival": c["arrival"],
                "first_scheduled": c["first_scheduled"],
                "first_token": c["first_token"],
                "finish": c["finish"],
                "prompt_len": c["prompt_len"],
                "output_len": c["output_len"],
                "num_output_tokens": c["num_output_tokens"],
                "state": [_STATE_NAMES[s] for s in c["state"].tolist()],
                "reason": c["reason"],
                "priority": c["priority"],
                "cls": c["cls"],
                "tenant": c["tenant"],
                "num_preemptions": c["num_preemptions"],
            }
        )
        for k, v in request_latencies(c).items():
            df[k] = v
        return df

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
            cells = [_fmt(self.variants[n].summary.get(k, float("nan"))) for n in names]
            lines.append(f"{k:<{width}}  " + "  ".join(f"{c:>{colw}}" for c in cells))
        return "\n".join(lines)

    def write(self, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
        """Write summary.json, requests.csv, series.csv (and steps.csv, plots); return the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        summary = {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "variants": self.summary,
            "config": {n: v.config.to_dict() for n, v in self.variants.items()},
        }
        p = out / "summary.json"
        p.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
        written.append(p)
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
        steps = self.steps
        if steps is not None:
            p = out / "steps.csv"
            steps.to_csv(p, index=False)
            written.append(p)
        if plots:
            from orcasim.metrics import plots as plotting

            written += plotting.write_all(self, out)
        return written


def _fmt(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v)}"
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v:.6g}" if abs(v) >= 1e-3 else f"{v:.4g}"


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    return x

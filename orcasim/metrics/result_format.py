"""Formatting of results: metric units and summary keys, tables, HTML, JSON values, files.

Helpers of :mod:`orcasim.metrics.results` that hold no result themselves.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from orcasim.metrics.results import VariantResult


_GROUP_KINDS = ("class", "tenant", "replica")


def pd_frame(columns: Mapping[str, Any]) -> pd.DataFrame:
    """A DataFrame of ``columns`` (pandas imported only here)."""
    import pandas as pd

    return pd.DataFrame(dict(columns))


def split_summary_key(key: str) -> tuple[str | None, str | None, str]:
    """Split a summary key into ``(group_kind, group, metric)``.

    ``"class.a.ttft_p99"`` -> ``("class", "a", "ttft_p99")``; a run-wide key
    ``k`` -> ``(None, None, k)``. The group name is everything between the
    kind and the last dot, as in :func:`orcasim.metrics.groups.split_groups`.
    """
    kind, dot, rest = key.partition(".")
    if dot and kind in _GROUP_KINDS and "." in rest:
        name, _, metric = rest.rpartition(".")
        return kind, name, metric
    return None, None, key


_LATENCIES = ("queue_delay_", "ttft_", "tpot_", "itl_", "e2e_")
_SHARES = ("_share", "_fraction", "_utilisation", "_rate", "_attainment", "_index",
           "kv_alloc_waste", "kv_peak_usage")


def metric_unit(metric: str) -> str:
    """The unit of a summary metric: s, ms, tok/s, req/s, share, bytes or count.

    Decided by the metric's name (``_s`` seconds, ``_tok_s``, ``_req_s``,
    latency statistics in seconds, shares in [0, 1]); everything else counts
    requests, tokens, steps or blocks.
    """
    if metric.endswith("_tok_s"):
        return "tok/s"
    if metric.endswith("_req_s") or metric == "requests_per_s":
        return "req/s"
    if metric.endswith("_ms"):
        return "ms"
    if metric.endswith("_s") or metric.startswith(_LATENCIES):
        return "s"
    if metric.endswith(_SHARES):
        return "share"
    if metric.endswith("_bytes"):
        return "bytes"
    return "count"


_HEADLINE = ("throughput_tok_s", "ttft_p99", "e2e_p99")


def headline(summary: Mapping[str, float]) -> str:
    """``500 requests, 498 finished, 2 rejected; throughput_tok_s 198.5, ...``."""
    counts = [f"{fmt(summary[k])} {label}" for k, label in
              (("num_requests", "requests"), ("num_finished", "finished"),
               ("num_rejected", "rejected"), ("num_aborted", "aborted"))
              if k in summary and (k in ("num_requests", "num_finished") or summary[k])]
    metrics = [f"{k} {fmt(summary[k])}" for k in _HEADLINE if k in summary]
    return "; ".join(part for part in (", ".join(counts), ", ".join(metrics)) if part)


def default_metrics(variants: Mapping[str, VariantResult]) -> list[str]:
    """``orcasim run``'s table metrics present in any variant, then rejection/abort reasons."""
    from orcasim.commands.run import TABLE_METRICS

    present = [m for m in TABLE_METRICS if any(m in v.summary for v in variants.values())]
    present += sorted({k for v in variants.values() for k in v.summary
                       if k.startswith(("rejected_", "aborted_"))})
    return present


def html_tables(variants: Mapping[str, VariantResult]) -> str:
    """``orcasim run``'s comparison table, then its per-class/tenant tables, as HTML."""
    from orcasim.commands.run import group_tables

    parts = [html_table(variants, default_metrics(variants))]
    for kind, keys in group_tables(variants):
        parts.append(f"<p>per {kind}:</p>" + html_table(variants, keys))
    return "\n".join(parts)


def html_table(variants: Mapping[str, VariantResult], metrics: Sequence[str]) -> str:
    """Metrics as rows, variants as columns, formatted as in :meth:`Results.table`."""
    import pandas as pd

    df = pd.DataFrame(
        {n: [fmt(v.summary.get(k, float("nan"))) for k in metrics] for n, v in variants.items()},
        index=list(metrics),
    )
    df.columns.name = "metric"
    return df.to_html(classes="orcasim-results")


def escape(text: str) -> str:
    import html

    return html.escape(text)


def existing_files(out: Path) -> set[Path]:
    """The files directly in ``out`` (where a run writes its outputs)."""
    return {p for p in out.iterdir() if p.is_file()}


def note_overwritten(out: Path, before: set[Path], written: Sequence[Path]) -> None:
    """Say on stderr how many files of a previous run this write replaced (scripts re-run)."""
    n = len(before & set(written))
    if n:
        print(f"note: overwriting {n} files in {out}", file=sys.stderr)


def fmt(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v)}"
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v:.6g}" if abs(v) >= 1e-3 else f"{v:.4g}"


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return jsonable(x.item())
    return x

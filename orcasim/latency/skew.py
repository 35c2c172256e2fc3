"""The skew correction of a decode batch whose context lengths differ.

The attention table gives the time of ``n`` decodes that all have the same
context. A real batch's contexts differ (on ShareGPT the longest is about
2.6 times the mean), and FlashAttention's variable-length kernel is then
somewhat slower than the uniform batch at the mean context (tile padding,
uneven work across SMs). LLMServingSim's profiler measures that and fits,
per bucket of the batch, a blend factor ``alpha`` (``tp<N>/skew_fit.csv``,
bucket axes in ``meta.yaml`` under ``skew_fit``)::

    t = t(mean context) + alpha * (t(longest context) - t(mean context))

A bucket is ``(pc, n, skew rate, longest context, prefill context)``: ``pc``
the step's prefill chunk (a profiled grid value; a step's chunk is snapped to
the nearest one in the table), ``n`` the decodes, skew rate ``(mean - min) /
(max - min)`` of their contexts, then the longest context and the prefill's
cached context. Each of the last four is labelled by the first bin whose
upper edge is >= the value. A bucket the fit did not see uses the pooled
``alpha_default`` of that TP degree. No correction without a fit (``enabled:
false`` or no ``skew_fit.csv``), with one decode, or when all contexts are equal.
"""

from __future__ import annotations

import csv
from bisect import bisect_left
from pathlib import Path

from orcasim.errors import ScenarioError

#: the bucket axes: (meta.yaml bins key, labels key)
AXES = (("n_bins", "n_labels"), ("skew_rate_bins", "skew_rate_labels"),
        ("kv_big_bins", "kv_big_labels"), ("kp_bins", "kp_labels"))


class Axis:
    """Bins ``(edges[i], edges[i + 1]]`` labelled ``labels[i]`` (values past the end: the last)."""

    def __init__(self, edges: list[float], labels: list[str]) -> None:
        self.upper = [float(e) for e in edges[1:]]
        self.labels = labels

    def label(self, value: float) -> str:
        i = bisect_left(self.upper, value)
        return self.labels[min(i, len(self.labels) - 1)]


class SkewFit:
    """The fitted blend factors of one TP folder, looked up per batch."""

    def __init__(self, axes: list[Axis], alphas: dict[tuple, float], default: float) -> None:
        self.axes = axes
        self.alphas = alphas
        self.default = default
        self.pcs = sorted({k[0] for k in alphas})

    def alpha(self, pc: float, n: int, kv_mean: float, kv_min: float, kv_max: float,
              kp: float) -> float:
        """The blend factor for a batch (see the module docstring)."""
        gap = kv_max - kv_min
        rate = (kv_mean - kv_min) / gap if gap > 0 else 0.5
        pcs = self.pcs
        grid_pc = min(pcs, key=lambda p: abs(p - pc)) if pcs else 0.0
        key = (grid_pc, self.axes[0].label(n), self.axes[1].label(min(max(rate, 0.0), 1.0)),
               self.axes[2].label(kv_max), self.axes[3].label(kp))
        return self.alphas.get(key, self.default)


def load_skew_fit(meta: dict, folder: Path, tp: int) -> SkewFit | None:
    """The skew fit of ``folder`` (TP degree ``tp``), or None when the profile has none."""
    fit = meta.get("skew_fit")
    path = folder / "skew_fit.csv"
    if not isinstance(fit, dict) or not fit.get("enabled") or not path.is_file():
        return None
    per_tp = (fit.get("per_tp") or {}).get(tp) or (fit.get("per_tp") or {}).get(str(tp)) or {}
    axes_meta = per_tp.get("bucket_axes") or fit.get("bucket_axes")
    where = str(folder.parent / "meta.yaml")
    if not isinstance(axes_meta, dict):
        raise ScenarioError("skew_fit.bucket_axes", "missing from meta.yaml", where)
    axes = []
    for bins, labels in AXES:
        b, lab = axes_meta.get(bins), axes_meta.get(labels)
        if not (isinstance(b, list) and isinstance(lab, list) and len(b) == len(lab) + 1
                and all(isinstance(x, (int, float)) for x in b)):
            raise ScenarioError(f"skew_fit.bucket_axes.{bins}", f"needs a list of numbers one "
                                f"longer than {labels}", where)
        axes.append(Axis(b, [str(x) for x in lab]))
    default = per_tp.get("alpha_default", 0.0)
    if not isinstance(default, (int, float)):
        raise ScenarioError(f"skew_fit.per_tp.{tp}.alpha_default", "not a number", where)
    return SkewFit(axes, _read_alphas(path), float(default))


def _read_alphas(path: Path) -> dict[tuple, float]:
    need = ("pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label", "alpha")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for c in need:
            if c not in (reader.fieldnames or []):
                raise ScenarioError(c, "column missing from the profile file", str(path))
        out: dict[tuple, float] = {}
        for lineno, row in enumerate(reader, start=2):
            try:
                pc, alpha = float(row["pc"]), float(row["alpha"])
            except (TypeError, ValueError):
                raise ScenarioError("pc, alpha", f"line {lineno}: not a number",
                                    str(path)) from None
            out[(pc, row["n_label"], row["skew_rate_label"], row["kv_big_label"],
                 row["kp_label"])] = alpha
    return out

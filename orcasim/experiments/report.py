"""``orcasim report DIR``: a sweep as a self-contained HTML page and a Markdown file.

The report reads only the sweep directory: the results table (every run),
and the per-request rows and step series kept for the first replication of
each point. It holds the sweep's setup, the sanity checks (conservation,
Little's law) and failed runs, a table of means with 95% confidence
intervals, each metric against every swept number with CI bands, latency
CDFs per variant and class, request lifetimes (Gantt), queue length, batch
size and KV usage over time, and rejections and preemptions by reason. A
section whose data the runs do not have says so instead of drawing nothing.

The HTML embeds its images (base64 PNG), so it is one file to mail or
archive; the Markdown references PNGs written next to it in ``report_files/``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orcasim.experiments import report_plots as plots
from orcasim.experiments.checks import LITTLE_TOLERANCE
from orcasim.experiments.report_doc import Doc
from orcasim.experiments.stats import aggregate, pm_table
from orcasim.experiments.store import SweepStore

if TYPE_CHECKING:
    import pandas as pd

#: metrics in the table and the metric-vs-parameter plots
REPORT_METRICS = ["throughput_tok_s", "ttft_p99", "tpot_p50", "e2e_p99", "queue_delay_p99",
                  "num_rejected", "goodput_req_s", "slo_attainment"]
PLOT_METRICS = ["throughput_tok_s", "ttft_p99", "tpot_p50", "e2e_p99"]


def write_report(sweep_dir: str | Path, out: str | Path | None = None,
                 metrics: Sequence[str] | None = None) -> dict[str, Path]:
    """Write ``report.html`` and ``report.md`` (default: into the sweep directory).

    ``out`` is created (with its parents) when missing; a :class:`~orcasim.errors.UsageError`
    when it cannot be, or when ``sweep_dir`` is not a sweep, before anything is written.
    """
    from orcasim.commands.common import check_output_dir

    if out is not None:
        check_output_dir(out, "out")
    store = SweepStore(sweep_dir)
    manifest = store.manifest()
    df = store.results()
    doc = build(store, manifest, df, list(metrics) if metrics else REPORT_METRICS)
    out_dir = Path(out) if out is not None else store.root
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir = out_dir / "report_files"
    img_dir.mkdir(exist_ok=True)
    for name, data in doc.images.items():
        (img_dir / f"{name}.png").write_bytes(data)
    paths = {"html": out_dir / "report.html", "markdown": out_dir / "report.md"}
    paths["html"].write_text(doc.html(), encoding="utf-8")
    paths["markdown"].write_text(doc.markdown("report_files"), encoding="utf-8")
    return paths


def build(store: SweepStore, manifest: dict[str, Any], df: pd.DataFrame,
          metrics: list[str]) -> Doc:
    """The report's content."""
    import orcasim

    params: list[str] = list(manifest["params"])
    doc = Doc(f"Sweep report: {manifest['scenario']}")
    ok = df[df["status"] == "ok"]
    if manifest.get("description"):
        doc.p(manifest["description"])
    grid = [f"`{k}`: {', '.join(str(v) for v in vals)}" for k, vals in manifest["grid"].items()]
    setup = [f"scenario `{manifest['source']}`, {manifest['seeds']} seed(s) per point "
             f"(base seed {manifest['base_seed']}), {len(manifest['points'])} point(s), "
             f"{manifest['num_runs']} run(s); orcasim {orcasim.__version__}"]
    setup += [f"grid {g}" for g in grid] or ["no grid: each variant once"]
    if manifest.get("overrides"):
        setup.append("overrides: " + ", ".join(f"`{k}={v}`" for k, v in manifest["overrides"]))
    doc.items(setup)
    _checks(doc, df, len(ok), manifest["num_runs"], params)
    metrics = [m for m in metrics if m in df.columns]
    agg = aggregate(ok, params, metrics)
    doc.h2("Results: mean ± 95% CI over seeds")
    if ok.empty:
        doc.p("No run finished successfully: nothing to summarise.")
        return doc
    doc.table(pm_table(agg, params, metrics))
    _versus(doc, ok, params, manifest)
    rep = _representative(ok, params)
    kept = _kept(store, ok, params)
    _latency(doc, kept, ok, params, rep)
    _lifetimes(doc, store, kept, rep, params)
    _outcomes(doc, kept)
    return doc


def _where(bad: pd.DataFrame, ok: pd.DataFrame, params: list[str]) -> str:
    """``" (rate = 1.5: 10 of 10 runs; ...)"``: which points the failing runs belong to."""
    keys = [p for p in params if ok[p].nunique() > 1] or params
    total = ok.groupby(keys, sort=False).size()
    parts = []
    for key, n in bad.groupby(keys, sort=False).size().items():
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k} = {v}" for k, v in zip(keys, key, strict=True))
        parts.append(f"{label}: {n} of {total[key if len(keys) > 1 else key[0]]}")
    more = f"; and {len(parts) - 6} more point(s)" if len(parts) > 6 else ""
    return " (" + "; ".join(parts[:6]) + more + ")"


def _checks(doc: Doc, df: pd.DataFrame, num_ok: int, num_runs: int,
            params: list[str]) -> None:
    doc.h2("Checks")
    bad = df[df["status"] != "ok"]
    lines = []
    if len(df) < num_runs:
        lines.append(f"{num_runs - len(df)} of {num_runs} runs have not run yet "
                     "(an interrupted sweep: run it again to finish).")
    ok = df[df["status"] == "ok"]
    cons = ok[ok["check_conservation"] == False]  # noqa: E712  (nullable booleans)
    little = ok[ok["check_little"] == False]  # noqa: E712
    if not cons.empty:
        lines.append(f"WARNING: {len(cons)} run(s) break conservation "
                     f"(arrived = finished + rejected + aborted){_where(cons, ok, params)}, "
                     f"e.g. run "
                     f"`{cons['run_id'].iloc[0]}`: {cons['check_warnings'].iloc[0]}")
    if not little.empty:
        lines.append(f"WARNING: {len(little)} run(s) miss Little's law by more than "
                     f"{LITTLE_TOLERANCE:.0%}{_where(little, ok, params)}: their measurement "
                     f"window is not in steady state (a queue still growing or draining; "
                     f"largest gap {little['little_rel_err'].max():.1%}), so their latencies "
                     f"describe a transient, e.g. run "
                     f"`{little['run_id'].iloc[0]}`: {little['check_warnings'].iloc[0]}")
    if cons.empty and little.empty and num_ok:
        lines.append(f"All {num_ok} successful runs conserve requests (arrived = finished + "
                     f"rejected + aborted, timestamps in order). {_little_text(ok)}")
    for err, g in bad.groupby("error", sort=False):
        lines.append(f"{len(g)} run(s) {g['status'].iloc[0]}: {err}")
    doc.items(lines)


def _little_text(ok: pd.DataFrame) -> str:
    """What the Little's-law check showed: a test only where a steady-state window was set.

    Over a whole run (no ``metrics.warmup``/``cooldown``) L = λW is an identity, so
    passing it says only that the timestamps are consistent.
    """
    import pandas as pd

    whole = "Little's law holds by construction over a whole run; it checks timestamps only"
    windowed = (ok["window_start_s"].notna() if "window_start_s" in ok.columns
                else pd.Series(False, index=ok.index))
    if not windowed.any():
        return whole + "."
    text = (f"Over their steady-state window, {int(windowed.sum())} run(s) satisfy Little's "
            f"law (L = λW within {LITTLE_TOLERANCE:.0%}; largest gap "
            f"{ok.loc[windowed, 'little_rel_err'].max():.2g}).")
    if not windowed.all():
        text += f" For the {int((~windowed).sum())} run(s) without a window: {whole}."
    return text


def _numeric(ok: pd.DataFrame, p: str) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(ok[p])) and ok[p].nunique() > 1


def _versus(doc: Doc, ok: pd.DataFrame, params: list[str], manifest: dict[str, Any]) -> None:
    varied = [p for p in params if ok[p].nunique() > 1 and p != "variant"]
    numeric = [p for p in varied if _numeric(ok, p)]
    for x in numeric:
        others = [p for p in varied if p != x]
        col = others[0] if others else None
        agg = aggregate(ok, params, PLOT_METRICS)
        if len(others) > 1:  # more dimensions: hold them at their middle values
            for p in others[1:]:
                agg = agg[agg[p] == _middle(ok[p])]
        doc.h2(f"Metrics against {x}")
        fig = plots.metric_vs_param(agg, x, PLOT_METRICS, hue="variant", col=col)
        doc.figure(f"vs_{_slug(x)}", fig, f"Mean over seeds against {plots.param_label(x)} "
                   f"(`{x}`), with the 95% "
                   "confidence interval as a band; latency axes are logarithmic where their "
                   "values span more than two decades."
                   + (f" Line style: `{col}`." if col else ""))
    if not numeric:
        doc.h2("Metrics by point")
        agg = aggregate(ok, params, PLOT_METRICS)
        label = [p for p in params if ok[p].nunique() > 1] or ["variant"]
        agg["point"] = agg[label].astype(str).agg(", ".join, axis=1)
        fig = plots.metric_bars(agg, "point", PLOT_METRICS)
        doc.figure("by_point", fig, "Mean over seeds per point, with 95% confidence intervals.")


def _middle(col: pd.Series) -> Any:
    vals = list(dict.fromkeys(col))
    return vals[(len(vals) - 1) // 2]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def _representative(ok: pd.DataFrame, params: list[str]) -> dict[str, Any]:
    """The point whose per-request data the detail plots show: each swept value at its middle."""
    return {p: _middle(ok[p]) for p in params if p != "variant"}


def _kept(store: SweepStore, ok: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """The kept per-request rows of the first replication of every point, with the params."""
    import pandas as pd

    frames = []
    first = ok.sort_values("rep", kind="stable").drop_duplicates("point_id")
    for row in first.itertuples(index=False):
        rid = row.run_id
        req = store.requests(rid)
        if req is None:
            continue
        req = req.drop(columns=[c for c in params if c in req.columns])
        vals = dict(zip(ok.columns, row, strict=True))
        frames.append(req.assign(run_id=rid, **{p: vals[p] for p in params}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _at(df: pd.DataFrame, point: dict[str, Any]) -> pd.DataFrame:
    for k, v in point.items():
        df = df[df[k] == v]
    return df


def _latency(doc: Doc, kept: pd.DataFrame, ok: pd.DataFrame, params: list[str],
             rep: dict[str, Any]) -> None:
    doc.h2("Latency distributions")
    if kept.empty:
        doc.p("No per-request rows were kept (`keep_requests: 0`), so there are no latency "
              "distributions; the table above has the percentiles.")
        return
    numeric = [p for p in params if p != "variant" and _numeric(ok, p)]
    facet = numeric[0] if numeric else None
    point = dict(rep)
    data = kept
    subset = ""
    if facet is not None:
        vals = list(dict.fromkeys(ok[facet]))
        shown = list(dict.fromkeys([vals[0], vals[(len(vals) - 1) // 2], vals[-1]]))
        point.pop(facet)
        data = kept[kept[facet].isin(shown)]
        subset = (f", one column per `{facet}` value" if len(shown) == len(vals) else
                  f", for {len(shown)} of the {len(vals)} `{facet}` values (lowest, middle, "
                  f"highest: {', '.join(str(v) for v in shown)})")
    data = _at(data, point)
    classes = kept["cls"].dropna().unique()
    where = ", ".join(f"`{k}` = {v}" for k, v in point.items())
    fig = plots.latency_cdfs(data, facet)
    doc.figure("latency_cdf", fig, "Empirical CDFs of TTFT and E2E latency of finished "
               "requests (first seed of each point)" + subset + (f" at {where}" if where else "")
               + (", line style by request class" if len(classes) > 1 else "") + ".")


def _lifetimes(doc: Doc, store: SweepStore, kept: pd.DataFrame, rep: dict[str, Any],
               params: list[str]) -> None:
    import pandas as pd

    if kept.empty:
        return
    here = _at(kept, rep)
    where = ", ".join(f"`{k}` = {v}" for k, v in rep.items()) or "the scenario's settings"
    doc.h2("Request lifetimes")
    per = int(here.groupby("variant").size().max())
    shown = f"The first {min(60, per)} of {per} requests" if per > 60 else f"All {per} requests"
    doc.figure("gantt", plots.gantt(here), f"{shown} of each variant at {where} "
               "(first seed): waiting in grey, running in blue, rejected or aborted as a red x.")
    frames = []
    for rid, variant in here[["run_id", "variant"]].drop_duplicates().itertuples(index=False):
        s = store.series(rid)
        if s is not None:
            frames.append(s.assign(variant=variant))
    if not frames:
        return
    series = pd.concat(frames, ignore_index=True)
    doc.h2("Queue, batch and KV memory over time")
    kv = plots.kv_columns(series)
    doc.figure("over_time", plots.over_time(series), f"Requests waiting and batch size over "
               f"time at {where} (time-weighted means per bin)."
               + (" KV usage from the policy's records." if kv else ""))
    if not kv:
        doc.p("These runs record no KV-cache usage (their policies keep no KV block pool), "
              "so there is no memory panel.")


def _outcomes(doc: Doc, kept: pd.DataFrame) -> None:
    import pandas as pd

    doc.h2("Rejections, aborts and preemptions")
    if kept.empty:
        doc.p("No per-request rows were kept.")
        return
    rows = []
    for variant, g in kept.groupby("variant", sort=False):
        for state in ("rejected", "aborted"):
            sel = g[g["state"] == state]
            for reason, n in sel["reason"].fillna("no reason given").value_counts().items():
                rows.append({"variant": variant, "what": f"{state}: {reason}", "count": int(n)})
        rows.append({"variant": variant, "what": "preemptions",
                     "count": int(g["num_preemptions"].sum())})
    counts = pd.DataFrame(rows)
    fig = plots.outcomes(counts)
    if fig is None:
        doc.p("No request was rejected, aborted or preempted in the kept runs "
              "(first seed of every point).")
        return
    doc.figure("outcomes", fig, "Rejected and aborted requests by reason, and preemptions, "
               "summed over the kept runs (first seed of every point).")
    wide = counts.pivot_table(index="what", columns="variant", values="count", aggfunc="sum",
                              fill_value=0, sort=False).reset_index()
    doc.table(wide)

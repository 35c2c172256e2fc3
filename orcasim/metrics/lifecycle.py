"""A run's results in inference-perf's lifecycle-metrics layout.

inference-perf writes ``summary_lifecycle_metrics.json`` (the whole run) and
``stage_<k>_lifecycle_metrics.json`` (one per load stage), each::

    {"load_summary": {"count", "schedule_delay", "send_duration", "requested_rate",
                      "achieved_rate"},
     "successes": {"count",
                   "latency": {"request_latency", "normalized_time_per_output_token",
                               "time_per_output_token", "time_to_first_token",
                               "inter_token_latency"},
                   "throughput": {"input_tokens_per_sec", "output_tokens_per_sec",
                                  "total_tokens_per_sec", "requests_per_sec"},
                   "prompt_len", "output_len"},
     "failures": {"count", "request_latency", "prompt_len"}}

where every distribution is ``{"mean", "min", "max", "p0.1", ..., "median", ...}``
(the config's ``report.request_lifecycle.percentiles``, numpy's linear
percentiles), in seconds. A request's start is when it was sent (its
arrival), its end the last token (or its abort); successes are the finished
requests. What differs from a measured file: ``inter_token_latency`` gives
each finished request's ``n - 1`` gaps its mean gap (the simulator keeps no
per-token times), so its mean is exact and its percentiles are over requests
weighted by tokens; ``schedule_delay`` is the delay of a send behind its
schedule (a stage that starts late, a full client, a multi-turn round
waiting for the previous one), which a real client also shows as its own
jitter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.request import RequestState

if TYPE_CHECKING:
    from orcasim.metrics.results import VariantResult


def summarize(items: np.ndarray, percentiles: Sequence[float],
              weights: np.ndarray | None = None) -> dict[str, float] | None:
    """inference-perf's ``summarize``: mean, min, max and percentiles; None when empty."""
    x = np.asarray(items, dtype=np.float64)
    if x.size == 0:
        return None
    if weights is not None:
        keep = weights > 0
        x = np.repeat(x[keep], weights[keep].astype(np.int64))
        if x.size == 0:
            return None
    out = {"mean": float(np.mean(x)), "min": float(np.min(x)), "max": float(np.max(x))}
    for q in percentiles:
        out["median" if q == 50 else f"p{q:g}"] = float(np.percentile(x, q))
    return out


def lifecycle_summary(cols: dict[str, Any], idx: np.ndarray, percentiles: Sequence[float],
                      scheduled: np.ndarray | None = None, rate: float | None = None
                      ) -> dict[str, Any]:
    """The lifecycle summary of requests ``idx`` (indices into the result columns)."""
    start = cols["arrival"][idx]
    end = np.where(np.isnan(cols["finish"][idx]), start, cols["finish"][idx])
    ok = cols["state"][idx] == int(RequestState.FINISHED)
    prompt = cols["prompt_len"][idx].astype(np.float64)
    n_out = cols["num_output_tokens"][idx]
    first = cols["first_token"][idx]
    total_time = float(end.max() - start.min()) if idx.size else 0.0
    load: dict[str, Any] = {"count": int(idx.size)}
    if scheduled is not None:
        load["schedule_delay"] = summarize(start - scheduled, percentiles)
    if rate is not None:
        send = float(start.max() - start.min()) if idx.size else 0.0
        load.update(send_duration=send, requested_rate=rate,
                    achieved_rate=idx.size / send if send > 0 else 0.0)
    s_lat = end[ok] - start[ok]
    s_out = n_out[ok]
    ttft = first[ok] - start[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(s_out > 1, (end[ok] - first[ok]) / (s_out - 1), np.nan)
        ntpot = np.where(s_out > 0, s_lat / s_out, 0.0)
    streamed = s_out > 1
    tokens_in = float(prompt[ok].sum())
    tokens_out = float(s_out.sum())

    def rate_of(x: float) -> float:
        return x / total_time if total_time > 0 else 0.0

    successes = {
        "count": int(ok.sum()),
        "latency": {
            "request_latency": summarize(s_lat, percentiles),
            "normalized_time_per_output_token": summarize(ntpot, percentiles),
            "time_per_output_token": summarize(tpot[streamed], percentiles),
            "time_to_first_token": summarize(ttft[streamed], percentiles),
            "inter_token_latency": summarize(tpot[streamed], percentiles,
                                             weights=s_out[streamed] - 1),
        },
        "throughput": {
            "input_tokens_per_sec": rate_of(tokens_in),
            "output_tokens_per_sec": rate_of(tokens_out),
            "total_tokens_per_sec": rate_of(tokens_in + tokens_out),
            "requests_per_sec": rate_of(float(ok.sum())),
        },
        "prompt_len": summarize(prompt[ok], percentiles),
        "output_len": summarize(s_out.astype(np.float64), percentiles),
    }
    failures = {
        "count": int((~ok).sum()),
        "request_latency": summarize(end[~ok] - start[~ok], percentiles),
        "prompt_len": summarize(prompt[~ok], percentiles),
    }
    return {"load_summary": load, "successes": successes, "failures": failures}


def write_lifecycle(result: VariantResult, out_dir: Path, seed: int) -> list[Path]:
    """Write the lifecycle files of an ``inference_perf`` variant into ``out_dir``."""
    from orcasim.simulation import generate_workload
    from orcasim.workload.inference_perf import load_config

    params = result.config.workload.params
    cfg, _ = load_config(params.config)
    qs = cfg.report.request_lifecycle.percentiles
    cols = result.columns
    arrays = generate_workload(result.config, seed)
    rel = arrays.release
    finish = np.where(np.isnan(cols["finish"]), cols["arrival"], cols["finish"])
    origins = np.asarray(rel.origins(finish))
    scheduled = origins[rel.stage] + rel.offset
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    everything = np.arange(len(cols["arrival"]))
    p = out_dir / "summary_lifecycle_metrics.json"
    p.write_text(json.dumps(lifecycle_summary(cols, everything, qs, scheduled), indent=2) + "\n")
    written.append(p)
    for k, stage in enumerate(cfg.load.stages):
        idx = np.flatnonzero(rel.stage == k)
        if idx.size == 0:  # inference-perf writes no file for a stage without requests
            continue
        p = out_dir / f"stage_{k}_lifecycle_metrics.json"
        body = lifecycle_summary(cols, idx, qs, scheduled[idx], stage.rate)
        p.write_text(json.dumps(body, indent=2) + "\n")
        written.append(p)
    return written


def write_workload_reports(res: Any, out_dir: str | Path) -> list[Path]:
    """Lifecycle files of each ``inference_perf`` variant in ``out_dir/inference_perf/<name>``."""
    written: list[Path] = []
    for name, v in res.items():
        if v.config.workload.type == "inference_perf":
            written += write_lifecycle(v, Path(out_dir) / "inference_perf" / name, res.seed)
    return written

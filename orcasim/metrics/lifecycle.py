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
percentiles), in seconds.

The figures are the client's, as inference-perf measures them. A request
starts when its client sent it (``sent``; its ``arrival`` when the API server
is not modelled) and ends when the client received its last message: the
step of its last token plus the front end's ``per_output_s`` (an aborted
request: when it was aborted; a rejected one: when it was turned away).
Its client-side token times are ``c_1 = first_token + per_output_s`` and
``c_n = finish + per_output_s`` for its ``n`` tokens; what inference-perf
makes of the streamed messages depends on its version (``version``):

========  =====================================  ===========  ==============  ==============
version   timestamps recorded                    tokens ``k``  TPOT            ITL gaps
========  =====================================  ===========  ==============  ==============
``0.4``   one per message, ``[DONE]`` included   ``n + 1``     span / ``n``    ``n - 1`` + one 0
          (chat: the role-only message too)      ``n + 1``     span/(n + 1)    ``n - 1`` + two 0s
``0.5``   two per message (each chunk's text     ``2n``        span/(2n - 1)   ``n - 1`` + ``n`` 0s
          re-tokenised with a BOS)
``0.6``   one per token                          ``n``         span/(n - 1)    ``n - 1``
========  =====================================  ===========  ==============  ==============

where span is ``c_n - c_1`` and vLLM streams one message per token (a
completion request; ``k`` is also the ``output_len`` and the throughput's
output tokens, and ``normalized_time_per_output_token`` is latency / ``k``).
TTFT is ``c_1 - start`` for a request with more than one timestamp. What
differs from a measured file: the simulator keeps no per-token times, so a
request's ``n - 1`` token gaps are each its mean gap (the ITL mean is exact,
its percentiles are over requests weighted by gaps); ``schedule_delay`` is
the delay of a send behind its schedule (a stage that starts late, a full
client, a multi-turn round waiting for the previous one), which a real
client also shows as its own jitter.
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


#: inference-perf versions whose streamed-message accounting is modelled (see above)
VERSIONS = ("0.4", "0.5", "0.6")


def summarize(items: np.ndarray, percentiles: Sequence[float],
              weights: np.ndarray | None = None) -> dict[str, float] | None:
    """inference-perf's ``summarize``: mean, min, max and percentiles; None when empty.

    ``weights``: how many times each item occurs (the same figures as for the
    repeated items, without repeating them)."""
    x = np.asarray(items, dtype=np.float64)
    if weights is None:
        w = np.ones(x.size, dtype=np.int64)
    else:
        w = np.asarray(weights, dtype=np.int64)
        x, w = x[w > 0], w[w > 0]
    if x.size == 0:
        return None
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    ends = np.cumsum(w)  # the repeated sample's index ends[j] - 1 is the last copy of x[j]
    total = int(ends[-1])
    out = {"mean": float(np.dot(x, w) / total), "min": float(x[0]), "max": float(x[-1])}
    for q in percentiles:
        h = (total - 1) * (q / 100.0)
        lo = int(np.floor(h))
        hi = min(lo + 1, total - 1)
        v_lo = x[np.searchsorted(ends, lo, side="right")]
        v_hi = x[np.searchsorted(ends, hi, side="right")]
        out["median" if q == 50 else f"p{q:g}"] = float(v_lo + (h - lo) * (v_hi - v_lo))
    return out


def client_times(cols: dict[str, Any], idx: np.ndarray, per_output_s: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests ``idx`` as their clients see them: (start, first message, end), s."""
    start = cols["sent"][idx] if "sent" in cols else cols["arrival"][idx]
    ok = cols["state"][idx] == int(RequestState.FINISHED)
    delay = np.where(ok, per_output_s, 0.0)
    finish = cols["finish"][idx]
    end = np.where(np.isnan(finish), cols["arrival"][idx], finish + delay)
    return start, cols["first_token"][idx] + delay, end


def lifecycle_summary(cols: dict[str, Any], idx: np.ndarray, percentiles: Sequence[float],
                      scheduled: np.ndarray | None = None, rate: float | None = None, *,
                      per_output_s: float = 0.0, version: str = "0.6",
                      chat: bool = False) -> dict[str, Any]:
    """The lifecycle summary of requests ``idx`` (indices into the result columns), as
    inference-perf ``version`` reports it (see the module docstring); ``chat``: the chat
    API, whose stream starts with a role-only message."""
    if version not in VERSIONS:
        raise ValueError(f"inference-perf version {version!r}: one of {', '.join(VERSIONS)}")
    start, first, end = client_times(cols, idx, per_output_s)
    ok = cols["state"][idx] == int(RequestState.FINISHED)
    prompt = cols["prompt_len"][idx].astype(np.float64)
    n = cols["num_output_tokens"][idx][ok].astype(np.int64)
    total_time = float(end.max() - start.min()) if idx.size else 0.0
    load: dict[str, Any] = {"count": int(idx.size)}
    if scheduled is not None:
        load["schedule_delay"] = summarize(start - scheduled, percentiles)
    if rate is not None:
        send = float(start.max() - start.min()) if idx.size else 0.0
        load.update(send_duration=send, requested_rate=rate,
                    achieved_rate=idx.size / send if send > 0 else 0.0)
    s_lat = end[ok] - start[ok]
    span = end[ok] - first[ok]
    # timestamps recorded m, tokens counted k, zero gaps z (see the module docstring)
    if version == "0.4":  # every message: [DONE], and the chat API's role-only one
        m, k, z = n + 1 + int(chat), n + 1, np.full_like(n, 1 + int(chat))
    elif version == "0.5":
        m, k, z = 2 * n, 2 * n, n
    else:
        m, k, z = n, n, np.zeros_like(n)
    streamed = m > 1
    many = n > 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = span / (m - 1)
        gap = np.where(many, span / (n - 1), 0.0)
        ntpot = np.where(k > 0, s_lat / k, 0.0)
    gaps = np.concatenate([gap[streamed & many], [0.0]])
    gap_w = np.concatenate([(n - 1)[streamed & many], [int(z[streamed].sum())]])
    tokens_in = float(prompt[ok].sum())
    tokens_out = float(k.sum())

    def rate_of(x: float) -> float:
        return x / total_time if total_time > 0 else 0.0

    successes = {
        "count": int(ok.sum()),
        "latency": {
            "request_latency": summarize(s_lat, percentiles),
            "normalized_time_per_output_token": summarize(ntpot, percentiles),
            "time_per_output_token": summarize(tpot[streamed], percentiles),
            "time_to_first_token": summarize(first[ok][streamed] - start[ok][streamed],
                                             percentiles),
            "inter_token_latency": summarize(gaps, percentiles, weights=gap_w),
        },
        "throughput": {
            "input_tokens_per_sec": rate_of(tokens_in),
            "output_tokens_per_sec": rate_of(tokens_out),
            "total_tokens_per_sec": rate_of(tokens_in + tokens_out),
            "requests_per_sec": rate_of(float(ok.sum())),
        },
        "prompt_len": summarize(prompt[ok], percentiles),
        "output_len": summarize(k.astype(np.float64), percentiles),
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
    fe = result.config.frontend
    how = {"per_output_s": fe.per_output_s if fe is not None else 0.0,
           "version": params.inference_perf_version, "chat": cfg.api.type == "chat"}
    arrays = generate_workload(result.config, seed)
    rel = arrays.release
    everything = np.arange(len(cols["arrival"]))
    _, _, end = client_times(cols, everything, how["per_output_s"])
    origins = np.asarray(rel.origins(end))
    scheduled = origins[rel.stage] + rel.offset
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    p = out_dir / "summary_lifecycle_metrics.json"
    body = lifecycle_summary(cols, everything, qs, scheduled, **how)
    p.write_text(json.dumps(body, indent=2) + "\n")
    written.append(p)
    for k, stage in enumerate(cfg.load.stages):
        idx = np.flatnonzero(rel.stage == k)
        if idx.size == 0:  # inference-perf writes no file for a stage without requests
            continue
        p = out_dir / f"stage_{k}_lifecycle_metrics.json"
        body = lifecycle_summary(cols, idx, qs, scheduled[idx], stage.rate, **how)
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

"""A run's results in the vocabulary of vLLM's ``vllm bench serve``.

``vllm bench serve --save-result`` (and tools that copy it, such as
inference-perf) reports a benchmark as a flat JSON object: ``duration``,
``completed``, token totals, request and token throughputs, and for each of
TTFT, TPOT, ITL and end-to-end latency (E2EL) the mean, median, standard
deviation and chosen percentiles, all in milliseconds. Writing a simulated
run under the same keys and units lets it sit next to a measured one without
a translation table. Differences from vLLM's own definitions are listed in
docs/metrics.md ("vLLM bench vocabulary").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from orcasim.metrics.stats import weighted_mean, weighted_percentiles
from orcasim.metrics.summary import percentile_label, request_latencies
from orcasim.request import RequestState

if TYPE_CHECKING:
    from orcasim.metrics.results import VariantResult

VLLM_PERCENTILES = (50, 90, 99)


def vllm_bench_metrics(
    result: VariantResult, percentiles: Sequence[float] = VLLM_PERCENTILES
) -> dict[str, float]:
    """One variant's result as ``vllm bench serve``'s result keys, in its units.

    Counts, tokens and latencies cover the finished requests (vLLM's
    successful ones), over the whole run; ``duration`` is the makespan.
    Percentile keys are written as vLLM writes them (``p99_ttft_ms``,
    ``p99.9_ttft_ms``). An empty sample gives NaN where vLLM would print 0.
    """
    cols = result.columns
    done = cols["state"] == int(RequestState.FINISHED)
    out = _totals(cols, done, float(result.summary["makespan_s"]))
    for name, (values, counts) in _latency_samples(cols, done, result.itl).items():
        out.update(_describe_ms(name, values, counts, percentiles))
    return out


def _totals(cols: dict, done: np.ndarray, duration: float) -> dict[str, float]:
    """``duration``, ``completed``, token totals and the three throughputs."""
    completed = int(done.sum())
    total_in = int(cols["prompt_len"][done].sum())
    total_out = int(cols["num_output_tokens"][done].sum())
    per_s = 1.0 / duration if duration > 0 else float("nan")
    return {
        "duration": duration,
        "completed": completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed * per_s,
        "output_throughput": total_out * per_s,
        "total_token_throughput": (total_in + total_out) * per_s,
    }


def _latency_samples(
    cols: dict, done: np.ndarray, itl: tuple[np.ndarray, np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each vLLM latency as ``(values in s, counts)``: one count per request, ITL weighted."""
    lat = request_latencies(cols)
    several = done & (cols["num_output_tokens"] > 1)

    def once(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = x[np.isfinite(x)]
        return x, np.ones(x.size, dtype=np.int64)

    return {
        "ttft": once(lat["ttft"][done]),
        "tpot": once(lat["tpot"][several]),
        "itl": (np.asarray(itl[0], dtype=np.float64), np.asarray(itl[1], dtype=np.int64)),
        "e2el": once(lat["e2e"][done]),
    }


def weighted_std(values: np.ndarray, counts: np.ndarray) -> float:
    """Population standard deviation (``numpy.std``, ddof 0) of the expanded sample."""
    n = counts.sum()
    if n <= 0:
        return float("nan")
    mean = np.dot(values, counts) / n
    return float(np.sqrt(np.dot(counts, (values - mean) ** 2) / n))


def _describe_ms(
    name: str, values: np.ndarray, counts: np.ndarray, qs: Sequence[float]
) -> dict[str, float]:
    """``mean_/median_/std_/p<q>_<name>_ms`` of the sample ``values`` (seconds) x ``counts``."""
    median, *rest = weighted_percentiles(values, counts, [50, *qs])
    out = {
        f"mean_{name}_ms": weighted_mean(values, counts) * 1000,
        f"median_{name}_ms": median * 1000,
        f"std_{name}_ms": weighted_std(values, counts) * 1000,
    }
    for q, v in zip(qs, rest, strict=True):
        out[f"p{percentile_label(q)}_{name}_ms"] = v * 1000
    return out

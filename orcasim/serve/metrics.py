"""``GET /metrics``: the served engine's state in Prometheus text format, with vLLM's names.

The simulation thread updates a :class:`ServeMetrics` (plain counters and
bucket counts, no Prometheus import in the simulation); a scrape turns it
into Prometheus metric families with ``prometheus-client``. Every latency is
in simulated seconds (what the engine's model says), except the real-time lag.

Names follow vLLM's ``/metrics`` where vLLM has the metric:
``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (and the older ``vllm:gpu_cache_usage_perc``;
both a fraction in [0, 1] as in vLLM), ``vllm:num_preemptions_total``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total`` (by ``finished_reason``),
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``
(and the older ``vllm:time_per_output_token_seconds``, the same samples),
``vllm:e2e_request_latency_seconds`` and ``vllm:request_queue_time_seconds``.
The simulator adds ``orcasim:realtime_lag_seconds`` (a histogram of wall clock
minus simulated time at each step end and arrival) and
``orcasim:requests_total`` by final state and reason. Serving a cluster, the
``vllm:`` gauges are the cluster's (running and waiting summed over replicas,
KV usage the mean of the replicas' shares) and
``orcasim:replica_num_requests_running``, ``..._waiting`` and
``orcasim:replica_kv_cache_usage_perc`` give each replica's, labelled
``replica``.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: vLLM's TTFT buckets, s
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
#: vLLM's inter-token latency buckets, s
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
#: vLLM's request latency buckets (E2E, queue time), s
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: real-time lag buckets, s
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)


class Histogram:
    """Bucket counts and a sum, observed with a count (many equal samples in O(log buckets))."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` samples equal to ``value``."""
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self.counts[i] += count
            self.sum += value * count

    def cumulative(self) -> tuple[list[tuple[str, int]], float]:
        """Prometheus buckets (``le`` label, cumulative count), ending with ``+Inf``, and sum."""
        with self._lock:
            counts, total = list(self.counts), self.sum
        out, acc = [], 0
        for bound, c in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out, total


class ServeMetrics:
    """What the simulation thread counts for ``/metrics``."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.lag = Histogram(LAG_BUCKETS)
        self.ended: dict[tuple[str, str], int] = {}  # (state, reason) -> requests
        self.success: dict[str, int] = {}  # finished_reason -> requests


def collector(metrics: ServeMetrics, snapshot: Callable[[], dict[str, Any]],
              model: str) -> Any:
    """A ``prometheus_client`` collector reading ``metrics`` and ``snapshot()`` at each scrape."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    labels = ["model_name", "engine"]
    values = [model, "0"]

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        return g

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=labels)
        c.add_metric(values, value)
        return c

    def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
        buckets, total = h.cumulative()
        f = HistogramMetricFamily(name, doc, labels=labels)
        f.add_metric(values, buckets, total)
        return f

    class Collector:
        def collect(self) -> Iterator[Any]:
            s = snapshot()
            yield gauge("vllm:num_requests_running", "Requests in the running batch.",
                        s["running"])
            yield gauge("vllm:num_requests_waiting", "Requests waiting to run.", s["waiting"])
            yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", s["kv_usage"])
            yield gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (1 = full; older name).",
                        s["kv_usage"])
            yield counter("vllm:num_preemptions", "Preemptions.", s["preemptions"])
            yield counter("vllm:prompt_tokens", "Prompt tokens computed.", s["prompt_tokens"])
            yield counter("vllm:generation_tokens", "Tokens generated.", s["generation_tokens"])
            ok = CounterMetricFamily("vllm:request_success", "Requests finished.",
                                     labels=[*labels, "finished_reason"])
            for reason, n in sorted(metrics.success.items()):
                ok.add_metric([*values, reason], n)
            yield ok
            yield histogram("vllm:time_to_first_token_seconds", "Time to first token (simulated).",
                            metrics.ttft)
            yield histogram("vllm:inter_token_latency_seconds", "Inter-token latency (simulated).",
                            metrics.itl)
            yield histogram("vllm:time_per_output_token_seconds",
                            "Inter-token latency (simulated; older name).", metrics.itl)
            yield histogram("vllm:e2e_request_latency_seconds",
                            "End-to-end request latency (simulated).", metrics.e2e)
            yield histogram("vllm:request_queue_time_seconds",
                            "Time from arrival to first scheduled (simulated).", metrics.queue)
            yield histogram("orcasim:realtime_lag_seconds",
                            "Wall clock minus simulated time at step ends and arrivals.",
                            metrics.lag)
            yield gauge("orcasim:realtime_lag_latest_seconds", "The latest real-time lag.",
                        s["lag"])
            per = s.get("replicas")
            if per is not None:  # a cluster: each replica's gauges, labelled by its name
                for k, (name, doc) in enumerate((
                        ("orcasim:replica_num_requests_running", "Requests in the replica's "
                         "running batch."),
                        ("orcasim:replica_num_requests_waiting", "Requests waiting on the "
                         "replica."),
                        ("orcasim:replica_kv_cache_usage_perc", "The replica's KV-cache usage "
                         "(1 = full)."))):
                    g = GaugeMetricFamily(name, doc, labels=[*labels, "replica"])
                    for row in per:
                        g.add_metric([*values, row[0]], row[k + 1])
                    yield g
            ended = CounterMetricFamily("orcasim:requests", "Requests by final state.",
                                        labels=[*labels, "state", "reason"])
            for (state, reason), n in sorted(metrics.ended.items()):
                ended.add_metric([*values, state, reason], n)
            yield ended

    return Collector()

"""The serving front end: the time a request spends outside the engine.

A served request passes through the API server before and after the engine.
Before: the server receives the HTTP request, parses it and tokenises the
prompt, then hands it to the engine's queue. After each engine step: the
new token is detokenised and streamed back as a server-sent event. The
engine's own timestamps (vLLM's ``queued_ts``, ``first_token_ts``,
``last_token_ts``) leave both out; a client's do not.

``engine: {frontend: {...}}`` models them (the process is
:class:`orcasim.api_server.ApiServer`) as:

- **one API server process, first come first served**: a request sent at
  ``s_i`` reaches the engine's queue at ``q_i = max(s_i, q_{i-1}) + request_s
  + per_prompt_token_s * prompt_len_i`` (so a burst of long prompts queues in
  the server, as it does in vLLM's single API-server process);
- **a fixed delay per streamed message**, ``per_output_s``: each token reaches
  the client that long after the step that produced it ends (no contention
  between streams is modelled).

The engine-side metrics (``ttft``, ``e2e``, ...) then start at the engine's
queue, as vLLM's do, and the summary adds the client's view:
``client_ttft`` (first token received - request sent), ``client_e2e``,
``client_tpot`` (per token, equal to the engine's: a fixed delay per message
cancels out) and ``client_tpot_per_message`` for load generators that record
``messages_per_token`` timestamps per generated token.

It is off unless given, except for workloads measured at the client
(``inference_perf``); ``frontend: off`` (``enabled: false``) turns it off.

Defaults are BLIS's published coefficients for vLLM's OpenAI API server with
Llama-3.1-8B-Instruct on one H100 (vLLM 0.8.4; ``alpha_coeffs`` in
``defaults.yaml`` of inference-sim/inference-sim: 232 us per request, 1.75 us
per prompt token before queueing, 3357 us per output token). BLIS adds its
per-token figure to every inter-token gap; here it delays each message
instead, because the step times come from the latency model (see
docs/real-gpu.md). The per-token tokenisation cost agrees with tokenizer
micro-benchmarks of a few microseconds per token
(tenstorrent/tt-inference-server#2173).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from orcasim.params import ComponentParams

#: statistics reported for each client-side latency
STATS = (("mean", None), ("p50", 50.0), ("p90", 90.0), ("p99", 99.0))


class FrontendOptions(ComponentParams):
    """``engine.frontend``: API-server time before the engine's queue and after each step."""

    enabled: bool = Field(True, description="false: leave the API server out (also written "
                          "frontend: off)")
    request_s: float = Field(232e-6, ge=0, le=3600, allow_inf_nan=False,
                             description="server time per request before queueing, s")
    per_prompt_token_s: float = Field(1.75e-6, ge=0, le=1, allow_inf_nan=False,
                                      description="tokenisation time per prompt token, s")
    per_output_s: float = Field(3.357e-3, ge=0, le=3600, allow_inf_nan=False,
                                description="delay of each streamed message after its step, s")
    messages_per_token: float = Field(1.0, gt=0, le=1000, allow_inf_nan=False,
                                      description="streamed messages a client records per "
                                      "generated token (inference-perf: about 2)")

    def service(self, prompt_len: int) -> float:
        """The API server's time for one request before it reaches the engine's queue, s."""
        return self.request_s + self.per_prompt_token_s * prompt_len

    def client_summary(self, cols: dict[str, Any], client_arrival: np.ndarray
                       ) -> dict[str, float]:
        """Client-side TTFT, E2E and TPOT (per token and per message) statistics, s: over
        all requests (``client_*``) and per request class (``class.<name>.client_*``)."""
        out = self._stats(cols, client_arrival, np.ones(len(client_arrival), dtype=bool), "")
        classes = cols.get("cls")
        if classes is not None:
            names = np.asarray([c if c is not None else "" for c in classes], dtype=object)
            for name in sorted({c for c in classes if c is not None}):
                out.update(self._stats(cols, client_arrival, names == name, f"class.{name}."))
        return out

    def _stats(self, cols: dict[str, Any], client_arrival: np.ndarray, mask: np.ndarray,
               prefix: str) -> dict[str, float]:
        first, finish = cols["first_token"], cols["finish"]
        n_out = cols["num_output_tokens"]
        done = mask & np.isfinite(first) & np.isfinite(finish)
        ttft = first[done] + self.per_output_s - client_arrival[done]
        e2e = finish[done] + self.per_output_s - client_arrival[done]
        k = n_out[done]
        many = k > 1
        tpot = (finish[done][many] - first[done][many]) / (k[many] - 1)
        msgs = k[many] * self.messages_per_token
        per_msg = (finish[done][many] - first[done][many]) / np.maximum(msgs - 1, 1)
        out: dict[str, float] = {}
        for name, v in (("client_ttft", ttft), ("client_e2e", e2e), ("client_tpot", tpot),
                        ("client_tpot_per_message", per_msg)):
            for stat, q in STATS:
                key = f"{prefix}{name}_{stat}"
                if not v.size:
                    out[key] = float("nan")
                else:
                    out[key] = float(v.mean() if q is None else np.percentile(v, q))
        return out

"""``roofline``: a step's time from a model preset and a GPU preset, compute vs memory bound.

One step on ``tp`` tensor-parallel GPUs costs (docs/latency.md has the derivation)::

    t = max(t_compute, t_memory) + t_comm + overhead
    t_compute = (2 * params * N + attention FLOPs) / tp / (peak FLOP/s * compute_efficiency)
    t_memory  = (weight bytes + KV bytes read + KV bytes written) / tp
                / (HBM bandwidth * bandwidth_efficiency)
    t_comm    = 2 * layers * N * hidden * dtype bytes * 2 (tp - 1) / tp / allreduce_bandwidth
                + 2 * layers * allreduce_latency                        (tp > 1 only)

with N the tokens computed in the step (prefill + decode). The per-token
FLOPs are ``2 * active params``: every parameter for a dense model, the shared
ones plus ``experts_per_token`` experts for a mixture of experts. Attention
FLOPs are ``4 * layers * heads * head_dim`` per (query token, context token)
pair: a decode token attends to its whole context, a prefill chunk of ``n``
tokens after ``c`` cached ones to ``n*c + n(n+1)/2`` pairs (causal). Weight
bytes are every weight of a dense model; an MoE step reads its shared weights
and the experts its N tokens are expected to touch (``E (1 - (1 - k/E)^N)``
per layer under uniform routing: ``k`` at one token, all ``E`` for large
batches). KV bytes read are the context the step attends to
(``plan.num_kv_tokens``), KV bytes written are the N new tokens. The
all-reduce bandwidth defaults to the GPU's interconnect (NVLink or PCIe, one
direction) times ``allreduce_efficiency``. Activations, the LM head's logits
and kernel launch gaps beyond ``overhead`` are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, model_validator

from orcasim.errors import SimulationError
from orcasim.hardware import GPUSpec, ModelSpec
from orcasim.latency.base import Coefficient, DecodeEnds, LatencyModel
from orcasim.model_specs import GPURef, ModelRef, model_label, resolve_gpu, resolve_model
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models

#: the lowest compute or bandwidth efficiency (a fraction of the GPU's peak)
MIN_EFFICIENCY = 0.001
#: the lowest all-reduce bandwidth, bytes/s
MIN_ALLREDUCE_BANDWIDTH = 1e6
#: achieved all-reduce bus bandwidth / the link's one-way bandwidth: NCCL all-reduce on 4 H100
#: SXM over NVLink (Vidur's data/profiling/network/h100_dgx/all_reduce.csv, messages of 8 MB
#: and more) moves 340 GB/s of its 450 GB/s (docs/latency.md, "Calibration")
ALLREDUCE_EFFICIENCY = 0.75


class RooflineParams(ComponentParams):
    """The hardware, the parallelism and the efficiencies of a roofline model."""

    model: ModelRef = Field("llama-2-7b", description="model: preset name or Hugging Face id "
                            "(orcasim.hardware.MODELS), config.json path, or inline shape")
    gpu: GPURef = Field("a100-80gb", description="GPU: preset name (orcasim.hardware.GPUS) or "
                        "inline figures")
    tp: int = Field(1, ge=1, description="tensor-parallel GPUs")
    compute_efficiency: float = Field(0.6, ge=MIN_EFFICIENCY, le=1, description="achieved / "
                                      "peak FLOP/s, 0.001 to 1")
    bandwidth_efficiency: float = Field(0.8, ge=MIN_EFFICIENCY, le=1, description="achieved / "
                                        "peak HBM bandwidth, 0.001 to 1")
    overhead: Coefficient = Field(0.001, description="fixed time per step, s (scheduling, "
                                  "sampling, launches; at most 3600)")
    allreduce_bandwidth: float | None = Field(
        None, ge=MIN_ALLREDUCE_BANDWIDTH, allow_inf_nan=False, description="all-reduce bus "
        "bandwidth per GPU, bytes/s (tp > 1; at least 1e6; default: the GPU's interconnect x "
        "allreduce_efficiency)")
    allreduce_efficiency: float = Field(ALLREDUCE_EFFICIENCY, ge=MIN_EFFICIENCY, le=1,
                                        description="achieved / one-way interconnect "
                                        "bandwidth of an all-reduce, 0.001 to 1")
    allreduce_latency: Coefficient = Field(5e-6, description="fixed time per all-reduce, s "
                                           "(at most 3600)")

    @model_validator(mode="after")
    def _presets(self) -> RooflineParams:
        m, g = resolve_model(self.model), resolve_gpu(self.gpu)
        name = model_label(self.model)
        if m.num_heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the {m.num_heads} attention heads "
                             f"of {name}")
        if m.weight_bytes(self.tp) >= g.memory_bytes:
            raise ValueError(f"{name} needs {m.weight_bytes(self.tp) / 1e9:.1f} GB of weights "
                             f"per GPU at tp={self.tp}; a {g.name} has "
                             f"{g.memory_bytes / 1e9:.0f} GB")
        return self

    def allreduce_rate(self, gpu: GPUSpec) -> float:
        """The all-reduce bus bandwidth, bytes/s: given, or the interconnect's share."""
        if self.allreduce_bandwidth is not None:
            return self.allreduce_bandwidth
        return gpu.interconnect_bandwidth * self.allreduce_efficiency


class RooflineCost:
    """The roofline's terms for one model, GPU and parallelism (no efficiencies applied).

    Used by the latency model and by ``orcasim calibrate``, which fits the
    efficiencies and overhead to measured step times.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int) -> None:
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.flops_per_token = 2.0 * model.active_params  # matmuls against the weights
        self.attn_flops_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self.weight_bytes = model.weight_bytes(tp)  # per GPU, every expert
        self.moe = model.is_moe
        self.kv_bytes_per_token = model.kv_bytes_per_token(tp)  # per GPU
        self.allreduce_bytes_per_token = 2 * model.num_layers * model.hidden_size * \
            model.dtype_bytes * 2 * (tp - 1) / tp
        self.num_allreduces = 2 * model.num_layers if tp > 1 else 0

    def attention_pairs(self, plan: StepPlan) -> float:
        """(query, context) token pairs the step's attention computes."""
        if plan.scheduled is not None:
            contexts = plan.contexts
            if contexts is None:
                contexts = [req.num_computed_tokens for req, _ in plan.scheduled]
            # n * c + n * (n + 1) / 2 per request: c + 1 for a one-token request (most of a
            # batch), so all are counted as that and the others corrected
            pairs = sum(contexts) + len(contexts)
            scheduled = plan.scheduled
            if len(scheduled) != len(contexts):
                raise ValueError("a plan has as many contexts as scheduled requests")
            k = plan.num_singles  # the first k are one-token requests: nothing to correct
            if k:
                scheduled, contexts = scheduled[k:], contexts[k:]
            for (_, n), c in zip(scheduled, contexts):  # noqa: B905 (lengths checked above)
                if n != 1:
                    pairs += (n - 1) * c + n * (n + 1) // 2 - 1
            return float(pairs)
        # aggregates only (decode-only policies): decode tokens attend to the KV tokens, and
        # the step's prefill sequences (fresh prompts) split the prefill tokens evenly
        decode = plan.num_decode_tokens
        prefill = plan.num_prefill_tokens
        pairs = plan.num_kv_tokens + decode
        k = plan.num_seqs - decode
        if prefill and k > 0:
            pairs += prefill * (prefill / k + 1) / 2
        return float(pairs)

    def terms(self, plan: StepPlan) -> tuple[float, float, float]:
        """Per GPU: the step's ``(FLOPs, HBM bytes, all-reduce bytes)``."""
        tokens = plan.num_prefill_tokens + plan.num_decode_tokens
        flops = self.flops_per_token * tokens + self.attn_flops_per_pair * \
            self.attention_pairs(plan)
        weights = self.model.weight_bytes_read(tokens, self.tp) if self.moe else self.weight_bytes
        mem = weights + self.kv_bytes_per_token * (plan.num_kv_tokens + tokens)
        return flops / self.tp, mem, self.allreduce_bytes_per_token * tokens


@latency_models.register("roofline")
class RooflineLatency(LatencyModel):
    """``max(compute, memory) + all-reduce + overhead`` from model and GPU presets."""

    Params = RooflineParams
    decode_by_aggregates = True  # one-token requests: n * c + 1 pairs each, kv + B in all
    prefill_by_aggregates = True  # and one prompt of P tokens from nothing: P (P + 1) / 2

    def __init__(self, params: RooflineParams) -> None:
        super().__init__(params)
        self.cost = RooflineCost(resolve_model(params.model), resolve_gpu(params.gpu), params.tp)
        g = self.cost.gpu
        self.flops_rate = g.peak_flops * params.compute_efficiency
        self.byte_rate = g.hbm_bandwidth * params.bandwidth_efficiency
        self.fixed = params.overhead + self.cost.num_allreduces * params.allreduce_latency
        self.allreduce_rate = params.allreduce_rate(g)

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        """The step's compute, memory and communication times, s (before the max)."""
        flops, mem, comm = self.cost.terms(plan)
        return {
            "compute": flops / self.flops_rate,
            "memory": mem / self.byte_rate,
            "comm": comm / self.allreduce_rate,
            "overhead": self.fixed,
        }

    def step_time(self, plan: StepPlan) -> float:
        flops, mem, comm = self.cost.terms(plan)
        compute, memory = flops / self.flops_rate, mem / self.byte_rate
        t = (memory if memory > compute else compute) + self.fixed  # max(compute, memory)
        if comm:
            t += comm / self.allreduce_rate
        return t

    def decode_step(self, num_seqs: int) -> Callable[[int], float] | None:
        """:meth:`step_time` of an all-decode plan of ``num_seqs`` sequences as a function of
        its KV tokens: the terms that depend only on the batch are worked out once, and the
        rest in :meth:`RooflineCost.terms`' order (tests compare the two)."""
        return self._decode_step(num_seqs, False)  # type: ignore[return-value]

    def _decode_step(self, num_seqs: int, ends: bool) -> Callable[..., Any] | None:
        """:meth:`decode_step` (``ends``: :meth:`decode_ends`) from the batch's terms."""
        cost = self.cost
        if type(self).step_time is not RooflineLatency.step_time or type(cost) is not RooflineCost:
            return None  # a subclass may count differently
        b = num_seqs
        f0, apf, tp = cost.flops_per_token * b, cost.attn_flops_per_pair, cost.tp
        weights = cost.model.weight_bytes_read(b, tp) if cost.moe else cost.weight_bytes
        kvb = cost.kv_bytes_per_token
        fr, br, fixed = self.flops_rate, self.byte_rate, self.fixed
        comm = cost.allreduce_bytes_per_token * b
        extra = comm / self.allreduce_rate if comm else 0.0

        def step_time(kv: int) -> float:
            compute = (f0 + apf * float(kv + b)) / tp / fr
            memory = (weights + kvb * (kv + b)) / br
            t = (memory if memory > compute else compute) + fixed  # max(compute, memory)
            if comm:
                t += extra
            return t

        if not ends:
            return step_time
        name = self.type_name

        margin = 1.0 + 1e-9
        growing = kvb >= 0.0 and br > 0.0  # a decode step's memory time grows with its KV

        def decode_ends(t: float, busy: float, kv: int, steps: int, limit: float,
                        out: list[float]) -> tuple[float, float]:
            append = out.append
            stop = kv + b * (steps + 1)
            # memory-bound at both ends of the run (x = kv + b and stop - b): the memory time
            # exceeds the compute time by far more than rounding could change (both are
            # linear in x: true at both ends, it is true at every step between)
            x0, x1 = kv + b, stop - b
            if (not comm and growing
                    and (weights + kvb * x0) / br > (f0 + apf * x0) / tp / fr * margin
                    and (weights + kvb * x1) / br > (f0 + apf * x1) / tp / fr * margin
                    and (weights + kvb * x0) / br + fixed > 0.0):
                # every step's max(compute, memory) is its memory time: the same sums as below
                # without the compute time; it grows with x, so the first step's is the least
                # and every step's is > 0 (else the loop below says which is not)
                for x in range(x0, stop, b):
                    d = (weights + kvb * x) / br + fixed
                    t += d
                    busy += d
                    append(t)
                    if t >= limit:
                        break
                return t, busy
            for x in range(kv + b, stop, b):  # x: step_time's kv + b
                compute = (f0 + apf * x) / tp / fr  # (apf * x: x converted as float(x))
                memory = (weights + kvb * x) / br
                d = (memory if memory > compute else compute) + fixed
                if comm:
                    d += extra
                if not d > 0.0:
                    raise SimulationError(f"latency model {name!r} returned a step time of "
                                          f"{d!r} s; it must be > 0")
                t += d
                busy += d
                append(t)
                if t >= limit:
                    break
            return t, busy

        return decode_ends

    def decode_ends(self, num_seqs: int) -> DecodeEnds | None:
        """:meth:`LatencyModel.decode_ends` with :meth:`decode_step`'s arithmetic inline."""
        if num_seqs < 1:
            return None
        return self._decode_step(num_seqs, True)  # type: ignore[return-value]

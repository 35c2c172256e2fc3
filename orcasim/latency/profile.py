"""``profile``: a step's time composed from per-operator GPU profile tables.

A profile directory (one model and dtype, e.g. ``.../Llama-3.1-8B/bf16``) holds
``meta.yaml`` and one folder per tensor-parallel degree (``tp1``, ``tp2``) with
the times of one decoder layer's operators, measured on the GPU:

- ``dense.csv`` (layer, tokens, time_us): each non-attention operator against
  the tokens in the step;
- ``attention.csv`` (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us):
  one layer's attention for a prefill chunk over ``kv_prefill`` cached tokens
  plus ``n_decode`` decodes of ``kv_decode`` context each;
- ``per_sequence.csv`` (layer, sequences, time_us): once-per-step work that
  scales with the sequences (lm_head, sampler).

A mixture-of-experts model's folder also holds ``moe.csv`` (tokens,
activated_experts, time_us): the MoE block in place of the dense MLP
(:mod:`orcasim.latency.profile_moe`). A step takes::

    num_layers * (sum of per-layer dense ops(T) + attention(step) + moe(T))
      + sum of per-step dense ops(T) + sum of per-sequence ops(num_seqs)
      + overhead_s + 2 * num_layers * all-reduce(tokens)   (tp > 1)
      + 2 * num_layers * gather(tokens)                    (expert_parallel > 1)

where the per-step dense operators (``embedding`` and ``final_layernorm`` by
default) run once per forward pass, not once per layer, and ``layernorm``
runs twice per layer. ``T`` is the step's token count, padded up to the next
``cudagraph_capture_sizes`` entry when it is at most the largest one: vLLM
replays a CUDA graph captured for that many tokens, so the dense operators
(and the MoE block) compute on the padding too, while attention, the lm_head
and the sampler run on the real requests. ``skew_fit.csv`` corrects decode
batches with skewed context lengths (:mod:`orcasim.latency.skew`).

``format: vidur`` (detected when the directory holds ``mlp.csv`` and
``attention.csv``) reads Vidur's compute profiles instead
(:mod:`orcasim.latency.profile_vidur`).

Interpolation is linear between grid points in every dimension, and linear
from the last two grid points beyond the grid (``extrapolate: clamp`` holds the
edge value instead). The attention table is not a full grid (the measured
``kv_prefill`` values depend on the chunk size), so it is interpolated axis by
axis in the order prefill_chunk, kv_prefill, n_decode, kv_decode: between the
two measured values of an axis that bracket the step, each inside the rows
that match the values already chosen for the earlier axes. On a full grid this
is exactly multilinear interpolation.

Files are read once per profile directory and TP degree, and shared by every
model instance built from them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.latency.base import DUMMY_PLAN, Coefficient, LatencyModel
from orcasim.latency.profile_attention import ProfileAttention
from orcasim.latency.profile_files import (  # noqa: F401  (re-exported)
    ATTENTION,
    BUILTIN_PROFILES,
    Profile,
    find_profile,
    load_profile,
    read_meta,
)
from orcasim.latency.profile_moe import MoeTable, Routing
from orcasim.latency.profile_tables import (  # noqa: F401  (re-exported)
    Curve,
    build_nested,
    eval_nested,
    read_table,
    summed_curves,
)
from orcasim.latency.profile_vidur import is_vidur, load_vidur
from orcasim.latency.skew import SkewFit
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models


@latency_models.register("profile")
class ProfileLatency(ProfileAttention, LatencyModel):
    """Step times composed from per-operator GPU profiles (dense, attention, per-sequence)."""

    class Params(ComponentParams):
        dir: str = Field(description="profile directory of one model and dtype (holds meta.yaml "
                         "and tp<N>/ folders; a Vidur model folder holds mlp.csv and "
                         "attention.csv), relative to the current directory, or a built-in "
                         "profile (rtx-pro-6000/llama-3.1-8b/bf16)")
        format: Literal["auto", "llmservingsim", "vidur"] = Field(
            "auto", description="profile layout: LLMServingSim's (tp<N>/dense.csv, ...) or "
            "Vidur's (mlp.csv, attention.csv); auto tells them apart by their files")
        tp: int = Field(1, ge=1, le=64, description="tensor-parallel degree: the tp<N> folder")
        num_layers: int | None = Field(None, ge=1, le=10_000, description="decoder layers; "
                                       "default: num_layers in meta.yaml")
        overhead_s: Coefficient = Field(0.0, description="fixed CPU time per step, s")
        per_step_ops: list[str] = Field(["embedding", "final_layernorm"], description=
                                        "dense operators that run once per step, not per layer")
        op_counts: dict[str, int] = Field({"layernorm": 2}, description="dense operators that "
                                          "run more than once per layer, and how often (a "
                                          "decoder layer has two RMSNorms)")
        skew_correction: bool = Field(True, description="apply the profile's skew fit "
                                      "(skew_fit.csv) to decode batches of uneven contexts")
        extrapolate: Literal["linear", "clamp"] = Field(
            "linear", description="beyond the grid: extend the edge segment, or hold its value")
        hidden_size: int | None = Field(None, ge=1, le=1_000_000, description="the model's "
                                        "hidden size: the all-reduced activations (tp > 1)")
        dtype_bytes: int = Field(2, ge=1, le=8, description="bytes per activation element")
        allreduce_bandwidth: float | None = Field(
            None, gt=1e6, allow_inf_nan=False, description="all-reduce bus bandwidth between "
            "the GPUs, bytes/s (tp > 1)")
        allreduce_latency: Coefficient = Field(0.0, description="fixed time per all-reduce, s")
        num_experts: int | None = Field(None, ge=1, le=100_000, description="experts per MoE "
                                        "layer (profiles with moe.csv); default: meta.yaml")
        experts_per_token: int | None = Field(None, ge=1, le=100_000, description="experts "
                                              "each token is routed to (profiles with "
                                              "moe.csv); default: meta.yaml")
        moe_routing: Routing = Field("uniform", description="experts a step's tokens touch: "
                                     "uniform (independent routing, expected distinct "
                                     "experts) or balanced (min(E, tokens x k))")
        expert_parallel: int = Field(1, ge=1, le=1024, description="GPUs the experts are "
                                     "spread over, one TP1 engine each (vLLM's "
                                     "enable_expert_parallel with data_parallel_size engines): "
                                     "each GPU runs E/ep experts on the tokens of all ep "
                                     "engines, gathered and scattered over the all-reduce "
                                     "link (needs hidden_size and allreduce_bandwidth)")
        cudagraph_capture_sizes: list[int] = Field(
            [], description="token counts vLLM captured CUDA graphs for: a step of at most "
            "the largest is padded to the next one for its dense and MoE operators "
            "(empty: no padding, as with enforce_eager)")
        block_size: int = Field(16, ge=1, le=1024, description="KV block size whose rows a "
                                "Vidur attention.csv is read at, when it holds several")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        directory = find_profile(params.dir)
        clamp = params.extrapolate == "clamp"
        self.clamp = clamp
        self.overhead = params.overhead_s
        self.vidur = None
        self.moe: MoeTable | None = None
        self.skew: SkewFit | None = None
        self.attention_tree = None
        fmt = params.format
        if fmt == "auto":
            fmt = "vidur" if is_vidur(directory) and not (directory / f"tp{params.tp}").is_dir() \
                else "llmservingsim"
        if fmt == "vidur":
            self._init_vidur(params, directory)
        else:
            self._init_llmservingsim(params, directory)
        sizes = sorted(set(params.cudagraph_capture_sizes))
        if sizes and sizes[0] < 1:
            raise ScenarioError("engine.latency.cudagraph_capture_sizes",
                                f"sizes must be >= 1, got {sizes[0]}")
        self.graph_sizes = sizes
        self.comm_fixed, self.comm_per_token = self._allreduce(params)
        ep_fixed, self.ep_per_token = self._ep_comm(params)
        self.tp_per_token = self.comm_per_token
        self.comm_fixed += ep_fixed
        self.comm_per_token += self.ep_per_token

    def _init_llmservingsim(self, params: Params, directory: Path) -> None:
        prof = load_profile(directory, params.tp)
        self.source = str(prof.folder)
        self.num_layers = self._layers(params, prof.meta, directory)
        clamp = self.clamp
        ops = list(dict.fromkeys(prof.dense["layer"].tolist()))
        self.per_layer = summed_curves(prof.dense, "tokens",
                                       [o for o in ops if o not in params.per_step_ops], clamp,
                                       params.op_counts)
        self.per_step = summed_curves(prof.dense, "tokens",
                                      [o for o in ops if o in params.per_step_ops], clamp)
        seq_ops = list(dict.fromkeys(prof.per_sequence["layer"].tolist()))
        self.per_seq = summed_curves(prof.per_sequence, "sequences", seq_ops, clamp)
        att = prof.attention
        keys = np.column_stack([att[c] for c in ATTENTION[1][:4]])
        self.attention_tree = build_nested(keys, att["time_us"] * 1e-6)
        self.skew = prof.skew if params.skew_correction else None
        if prof.moe is not None:
            self.moe = MoeTable(prof.moe, prof.moe_scale,
                                self._moe_int(params, prof.meta, "num_experts", prof.moe),
                                self._moe_int(params, prof.meta, "experts_per_token", prof.moe),
                                params.moe_routing, clamp, params.expert_parallel)

    def _init_vidur(self, params: Params, directory: Path) -> None:
        tables = load_vidur(directory, params.tp, params.block_size, self.clamp)
        self.source = str(directory)
        self.num_layers = self._layers(params, read_meta(directory), directory)
        self.per_layer = [c for name, c in tables.ops.items() if name not in params.per_step_ops]
        self.per_step = [c for name, c in tables.ops.items() if name in params.per_step_ops]
        self.per_seq = []
        self.vidur = tables

    @staticmethod
    def _moe_int(params: Params, meta: dict, key: str, path: Path) -> int:
        """``num_experts`` or ``experts_per_token``: the parameter, else meta.yaml."""
        v = getattr(params, key)
        if v is None:
            v = meta.get(key)
        if type(v) is int and v >= 1:
            return v
        raise ScenarioError(f"engine.latency.{key}", "required by a mixture-of-experts "
                            "profile (moe.csv): meta.yaml does not give it", str(path))

    def _allreduce(self, params: Params) -> tuple[float, float]:
        """(fixed, per-token) time of the step's all-reduces, s: two per layer at tp > 1.

        A tp<N> folder holds one GPU's share of each operator (the profiler
        divides the model's dimensions); the GPUs then all-reduce the
        attention and MLP outputs of every layer, ``tokens x hidden_size x
        dtype_bytes`` each, as a ring moving ``2 (tp - 1) / tp`` of it.
        """
        if params.tp == 1:
            return 0.0, 0.0
        if params.hidden_size is None or params.allreduce_bandwidth is None:
            raise ScenarioError("engine.latency", f"tp {params.tp} needs hidden_size and "
                                "allreduce_bandwidth: the profile holds one GPU's operators, "
                                "not the all-reduces between the GPUs")
        n = 2 * self.num_layers
        ring = 2 * (params.tp - 1) / params.tp
        per_token = ring * params.hidden_size * params.dtype_bytes / params.allreduce_bandwidth
        return n * params.allreduce_latency, n * per_token

    def _ep_comm(self, params: Params) -> tuple[float, float]:
        """(fixed, per-token) time of the expert-parallel gathers, s: two per MoE layer.

        vLLM's default all2all backend (``allgather_reducescatter``) all-gathers
        the hidden states of the ``ep`` engines' tokens before each MoE block
        and reduce-scatters its output after it. With a ring over ``ep`` GPUs
        and steps of ``N`` tokens per engine each GPU sends ``(ep - 1) N``
        tokens of ``hidden_size x dtype_bytes`` in each, at the all-reduce link's
        bandwidth and latency.
        """
        ep = params.expert_parallel
        if ep == 1:
            return 0.0, 0.0
        if self.moe is None:
            raise ScenarioError("engine.latency.expert_parallel", "needs a mixture-of-experts "
                                "profile (moe.csv)", self.source)
        if params.tp != 1:
            raise ScenarioError("engine.latency.expert_parallel", "is modelled for TP1 engines "
                                f"only, got tp {params.tp}")
        if params.hidden_size is None or params.allreduce_bandwidth is None:
            raise ScenarioError("engine.latency", f"expert_parallel {ep} needs hidden_size and "
                                "allreduce_bandwidth: the tokens are gathered between the GPUs")
        n = 2 * self.num_layers
        per_token = (ep - 1) * params.hidden_size * params.dtype_bytes / \
            params.allreduce_bandwidth
        return n * params.allreduce_latency, n * per_token

    @staticmethod
    def _layers(params: Params, meta: dict, directory: Path) -> int:
        """The decoder layer count: the parameter, else ``num_layers`` in meta.yaml."""
        if params.num_layers is not None:
            return params.num_layers
        n = meta.get("num_layers")
        if isinstance(n, int) and n >= 1:
            return n
        raise ScenarioError("engine.latency.num_layers", "required: meta.yaml does not give "
                            "num_layers", str(directory))

    def padded_tokens(self, tokens: int) -> int:
        """The token count the step's CUDA graph computes: the next capture size, if any."""
        sizes = self.graph_sizes
        if not sizes or tokens > sizes[-1]:
            return tokens
        return sizes[bisect_left(sizes, tokens)]

    def graph_tokens(self, tokens: int) -> tuple[int, bool]:
        """(:meth:`padded_tokens`, whether a CUDA graph was captured for that many tokens)."""
        sizes = self.graph_sizes
        if not sizes or tokens > sizes[-1]:
            return tokens, False
        return sizes[bisect_left(sizes, tokens)], True

    def step_time(self, plan: StepPlan) -> float:
        real = plan.num_prefill_tokens + plan.num_decode_tokens
        attention = self.attention_time(plan) if real else 0.0
        tokens = float(self.padded_tokens(real)) if real else 0.0
        layer = sum(c(tokens) for c in self.per_layer) + attention
        if self.moe is not None:
            layer += self.moe(tokens)
        t = (self.num_layers * layer + sum(c(tokens) for c in self.per_step)
             + sum(c(float(plan.num_seqs)) for c in self.per_seq) + self.overhead
             + self.comm_fixed + self.comm_per_token * tokens)
        if not (t > 0 and math.isfinite(t)):
            self._bad_time(t, plan, real)
        return t

    def lockstep_time(self, plan: StepPlan | None, tokens: int, moe_tokens: float,
                      gather_tokens: int) -> float:
        """One engine's step in a data-parallel group stepping together (``plan`` None: a
        dummy step), s.

        The dense operators compute ``tokens`` (the group's padded count
        under CUDA graphs, :mod:`orcasim.cluster.lockstep`); the MoE block
        runs this GPU's experts on the tokens gathered from every engine of
        the group, read from the table at ``moe_tokens`` per engine (their
        mean), and the expert-parallel gathers move the largest engine's
        ``gather_tokens``. vLLM's dummy batch (``execute_dummy_batch``:
        ``_dummy_run(1, uniform_decode=True)`` in ``vllm/v1/worker/``)
        runs the model's forward pass on one one-token sequence, padded
        like the others, and neither the lm_head nor the sampler.
        """
        dummy = plan is None
        if dummy:
            plan = DUMMY_PLAN
        real = plan.num_prefill_tokens + plan.num_decode_tokens
        attention = self.attention_time(plan) if real else 0.0
        t_dense = float(tokens)
        layer = sum(c(t_dense) for c in self.per_layer) + attention
        if self.moe is not None:
            layer += self.moe(float(moe_tokens))
        t = (self.num_layers * layer + sum(c(t_dense) for c in self.per_step)
             + (0.0 if dummy else sum(c(float(plan.num_seqs)) for c in self.per_seq))
             + self.overhead + self.comm_fixed + self.tp_per_token * t_dense
             + self.ep_per_token * gather_tokens)
        if not (t > 0 and math.isfinite(t)):
            self._bad_time(t, plan, real)
        return t

    def _bad_time(self, t: float, plan: StepPlan, real: int) -> None:
        raise OrcasimError(
            f"{self.source}: the profile gives {t:.6g} s for a step with {plan.num_seqs} "
            f"sequences, {real} tokens and attention inputs "
            f"{self.attention_inputs(plan)} (extrapolated "
            "past the profile; use extrapolate: clamp)")

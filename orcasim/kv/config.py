"""The ``memory:`` scenario section and the KV capacity it implies.

KV bytes per token (per GPU) = 2 (K and V) x layers x KV heads / tp x head dim x dtype bytes.
Blocks = floor((GPU memory x utilisation - weights / tp - activation reserve)
/ (block_size x KV bytes per token)); or ``num_blocks`` given directly. This is
vLLM's sizing: it gives the KV cache what is left of ``gpu_memory_utilization``
of the device's memory after the weights and the peak activation and runtime
memory it measures in a profiling forward pass; that last part is the
``activation_reserve_gb`` here (0 unless given; docs/memory.md says how to
estimate it). The model and GPU are presets, a ``config.json`` or inline
(:mod:`orcasim.model_specs`).

Reservation allocators (the vLLM paper's baselines) reserve, per request, a
contiguous region when it starts:

- ``max``: ``max_model_len`` slots (Orca (Max), FasterTransformer);
- ``pow2``: the prompt plus the next power of two of the true output length
  (Orca (Pow2): over-reserves the output by at most 2x), at most ``max_model_len``;
- ``oracle``: exactly the slots the request will fill (Orca (Oracle)).

A reservation is placed at the first hole that fits (``placement:
first_fit``) or in a power-of-two chunk of a buddy allocator (``buddy``, what
the vLLM paper assumes for its Orca baselines).

A request fills at most ``P + o - 1`` KV slots: its prompt (an empty prompt
counts as one start token) and every output token but the last, whose KV is
never computed. That is its *footprint*; ``oracle`` reserves exactly it and
``pow2`` reserves ``P + next_pow2(o) - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orcasim.hardware import GB, ModelSpec
from orcasim.model_specs import GPURef, ModelRef, resolve_gpu, resolve_model
from orcasim.params import ComponentParams
from orcasim.workload.base import MAX_TOKENS_PER_REQUEST

Allocator = Literal["paged", "max", "pow2", "oracle"]
#: bounds of a pool: tokens per block, and blocks (a paged pool counts them, O(1) each)
MAX_BLOCK_SIZE = 4096
MAX_BLOCKS = 100_000_000


class MemoryOptions(ComponentParams):
    """The ``memory:`` section: block size, capacity (given or from a model and GPU), swap."""

    allocator: Allocator = Field("paged", description="paged blocks, or max/pow2/oracle "
                                 "contiguous reservation")
    placement: Literal["first_fit", "buddy"] = Field(
        "first_fit", description="where a reservation goes: the first hole that fits, or a "
        "power-of-two buddy chunk")
    block_size: int = Field(16, gt=0, le=MAX_BLOCK_SIZE, description="tokens per KV block")
    num_blocks: int | None = Field(None, gt=0, le=MAX_BLOCKS, description="KV blocks on the "
                                   "GPU (default: from model and gpu)")
    model: ModelRef | None = Field(None, description="model: preset name or Hugging Face id "
                                   "(orcasim.hardware.MODELS), config.json path, or inline "
                                   "shape")
    gpu: GPURef | None = Field(None, description="GPU: preset name (orcasim.hardware.GPUS) or "
                               "inline figures")
    tp: int = Field(1, gt=0, le=1024, description="tensor-parallel GPUs: divide weights and "
                    "KV heads")
    gpu_memory_gb: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                        description="memory per GPU, GB (default: the preset's)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory "
                                          "for weights, activations and KV")
    activation_reserve_gb: float = Field(0.0, ge=0, le=1e6, allow_inf_nan=False,
                                         description="GB per GPU kept for activations")
    bytes_per_token: int | None = Field(None, gt=0, le=10**9, description="KV bytes per token "
                                        "per GPU (default: from model)")
    max_model_len: int | None = Field(None, gt=0, le=MAX_TOKENS_PER_REQUEST,
                                      description="longest sequence (prompt + output); default: "
                                      "the model's")
    swap_space_gb: float = Field(4.0, ge=0, le=1e6, allow_inf_nan=False,
                                 description="CPU memory for swapped-out KV blocks, GB")
    pcie_bandwidth: float | None = Field(None, gt=0, le=1e15, allow_inf_nan=False,
                                         description="host<->device bytes/s for swapping "
                                         "(default: the GPU's)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: Any) -> Any:
        if v is not None:
            resolve_model(v)
        return v

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: Any) -> Any:
        if v is not None:
            resolve_gpu(v)
        return v

    @model_validator(mode="after")
    def _capacity_given(self) -> MemoryOptions:
        if self.num_blocks is None:
            if self.model is None or (self.gpu is None and self.gpu_memory_gb is None):
                raise ValueError("give num_blocks, or model and gpu (or gpu_memory_gb)")
            resolve(self)  # the weights must fit
        if self.allocator == "max" and self.max_model_len is None and self.model is None:
            raise ValueError("allocator max needs max_model_len (or a model)")
        return self


@dataclass(frozen=True)
class MemoryLayout:
    """Resolved KV memory of one engine: everything the pool needs, in plain numbers."""

    allocator: Allocator
    num_blocks: int
    block_size: int
    bytes_per_token: int | None  # None: unknown (no model given); swapping then impossible
    max_model_len: int | None
    num_swap_blocks: int
    pcie_bandwidth: float
    placement: Literal["first_fit", "buddy"] = "first_fit"

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def block_bytes(self) -> int | None:
        return None if self.bytes_per_token is None else self.block_size * self.bytes_per_token


def kv_blocks(
    model: str | ModelSpec, gpu_memory: float, *, tp: int = 1, block_size: int = 16,
    utilization: float = 0.9, activation_reserve: float = 0.0,
) -> int:
    """KV blocks per engine for ``model`` on GPUs of ``gpu_memory`` bytes (may be <= 0)."""
    m = resolve_model(model)
    free = gpu_memory * utilization - m.weight_bytes(tp) - activation_reserve
    return int(free // (block_size * m.kv_bytes_per_token(tp)))


def resolve(opts: MemoryOptions) -> MemoryLayout:
    """The layout of ``opts``; ValueError if the model's weights leave no room for KV blocks."""
    m = resolve_model(opts.model) if opts.model is not None else None
    g = resolve_gpu(opts.gpu) if opts.gpu is not None else None
    bpt = opts.bytes_per_token
    if bpt is None and m is not None:
        bpt = m.kv_bytes_per_token(opts.tp)
    num_blocks = opts.num_blocks
    if num_blocks is None:
        assert m is not None
        mem = opts.gpu_memory_gb * GB if opts.gpu_memory_gb is not None else g.memory_bytes  # type: ignore[union-attr]
        num_blocks = kv_blocks(
            m, mem, tp=opts.tp, block_size=opts.block_size,
            utilization=opts.gpu_memory_utilization,
            activation_reserve=opts.activation_reserve_gb * GB,
        )
        if num_blocks < 1:
            raise ValueError(
                f"no room for KV blocks: {opts.gpu_memory_utilization:g} x {mem / GB:g} GB "
                f"per GPU minus {m.weight_bytes(opts.tp) / GB:.3g} GB of weights"
                f"{'' if opts.tp == 1 else f' (tp={opts.tp})'} minus "
                f"{opts.activation_reserve_gb:g} GB of activations is less than one block"
            )
    max_len = opts.max_model_len
    if max_len is None and m is not None:
        max_len = m.max_model_len
    swap_blocks = 0
    if bpt is not None:
        swap_blocks = int(opts.swap_space_gb * GB // (opts.block_size * bpt))
    bw = opts.pcie_bandwidth or (g.pcie_bandwidth if g is not None else 25e9)
    return MemoryLayout(opts.allocator, num_blocks, opts.block_size, bpt, max_len,
                        swap_blocks, bw, opts.placement)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (n >= 1)."""
    return 1 << (n - 1).bit_length()


def footprint(prompt_len: int, output_len: int) -> int:
    """KV slots a request fills at most: prompt (>= 1) + output - 1."""
    return max(prompt_len, 1) + output_len - 1


def reservation(layout: MemoryLayout, prompt_len: int, output_len: int) -> int:
    """Contiguous slots a reservation allocator reserves for a request."""
    a = layout.allocator
    if a == "oracle":
        return footprint(prompt_len, output_len)
    if a == "pow2":
        size = max(prompt_len, 1) + next_pow2(output_len) - 1
        return size if layout.max_model_len is None else min(size, layout.max_model_len)
    if a == "max":
        assert layout.max_model_len is not None
        return layout.max_model_len
    raise ValueError(f"{a!r} is not a reservation allocator")

"""Model and GPU presets: the numbers latency models and KV-capacity calculations need.

Model figures come from the models' published configurations; GPU figures
are datasheet peaks (dense FP16/BF16 tensor throughput, HBM bandwidth,
memory). Efficiencies are applied by the models that use them, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
GiB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape."""

    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def weight_bytes(self, tp: int = 1) -> float:
        """Weight bytes held by each of ``tp`` tensor-parallel GPUs."""
        return self.num_params * self.dtype_bytes / tp

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token per GPU: 2 (K and V) x layers x kv heads x head dim x dtype.

        With tensor parallelism the KV heads are split across GPUs (a KV head
        is replicated when there are fewer KV heads than GPUs).
        """
        kv_heads = max(1, self.num_kv_heads // tp) if tp > 1 else self.num_kv_heads
        return 2 * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    """An accelerator's peak figures."""

    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    peak_flops: float  # dense FP16/BF16 tensor FLOP/s
    pcie_bandwidth: float = 25e9  # host<->device bytes/s, for swapping KV blocks


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 6.74e9, 32, 4096, 32, 32, 11008, 32000, 4096),
        ModelSpec("llama-2-13b", 13.02e9, 40, 5120, 40, 40, 13824, 32000, 4096),
        ModelSpec("llama-2-70b", 68.98e9, 80, 8192, 64, 8, 28672, 32000, 4096),
        ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 14336, 128256, 131072),
        ModelSpec("llama-3.1-70b", 70.55e9, 80, 8192, 64, 8, 28672, 128256, 131072),
        ModelSpec("mistral-7b", 7.24e9, 32, 4096, 32, 8, 14336, 32000, 32768),
        ModelSpec("qwen2.5-7b", 7.62e9, 28, 3584, 28, 4, 18944, 152064, 32768),
        ModelSpec("qwen2.5-72b", 72.71e9, 80, 8192, 64, 8, 29568, 152064, 32768),
        ModelSpec("opt-13b", 12.85e9, 40, 5120, 40, 40, 20480, 50272, 2048),
    )
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("a10g", 24 * GB, 600e9, 125e12, 16e9),
        GPUSpec("l4", 24 * GB, 300e9, 121e12, 16e9),
        GPUSpec("a100-40gb", 40 * GB, 1555e9, 312e12, 25e9),
        GPUSpec("a100-80gb", 80 * GB, 2039e9, 312e12, 25e9),
        GPUSpec("h100-80gb", 80 * GB, 3350e9, 989e12, 50e9),
        GPUSpec("h200", 141 * GB, 4800e9, 989e12, 50e9),
    )
}


def get_model(name: str) -> ModelSpec:
    """The model preset ``name``; KeyError lists the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})") from None


def get_gpu(name: str) -> GPUSpec:
    """The GPU preset ``name``; KeyError lists the known ones."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r} (known: {', '.join(sorted(GPUS))})") from None

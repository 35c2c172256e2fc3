"""Model and GPU specs: the numbers latency models and KV-capacity calculations need.

A :class:`ModelSpec` is a decoder-only transformer's shape, dense or
mixture-of-experts; a :class:`GPUSpec` an accelerator's datasheet peaks and
its GPU-to-GPU link. Presets are addressable by a short name
(``llama-2-7b``) and, for models, by their Hugging Face id
(``meta-llama/Llama-2-7b-hf``); :mod:`orcasim.model_specs` builds specs from
a ``config.json`` or an inline scenario section. Efficiencies are applied by
the models that use the specs, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

GB = 1e9
GiB = 1024**3

#: bytes per parameter of the dtypes a config may name
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2,
               "bfloat16": 2, "bf16": 2, "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "int8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    ``num_params`` is the total parameter count (every expert of an MoE
    model); ``None`` computes it from the architecture
    (:meth:`architecture_params`). ``head_dim`` 0 means ``hidden_size //
    num_heads`` (Qwen3 sets it apart: 128 against 5120 / 64 = 80). An MoE
    model has ``num_experts`` experts of ``moe_intermediate_size`` in every
    layer (in place of the dense MLP) and routes each token to
    ``experts_per_token`` of them.
    """

    name: str
    num_params: float | None
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2
    head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    gated_mlp: bool = True  # SwiGLU (gate, up, down); False: two matrices (OPT)
    tie_word_embeddings: bool = False
    hf_id: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_params is None:
            object.__setattr__(self, "num_params", float(self.architecture_params()))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_params(self) -> int:
        """Parameters of one expert of one layer (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size if self.is_moe else 0

    def architecture_params(self) -> int:
        """Parameters counted from the shape.

        Embeddings ``V·h`` (and as many again for an untied LM head); per
        layer the attention projections ``h·d·(H + 2·KV) + H·d·h``, the MLP
        (``3·h·I`` gated, ``2·h·I`` not; an MoE layer has ``E`` experts of
        ``3·h·I_moe`` and a router ``h·E``) and two norms ``2·h``; a final
        norm ``h``. Biases, position embeddings and QK norms are left out.
        """
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        if self.is_moe:
            mlp = self.num_experts * self.expert_params + h * self.num_experts
        else:
            mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_layers * (attn + mlp + 2 * h) + h

    @property
    def active_params(self) -> float:
        """Parameters one token is multiplied with: all but the experts it is not routed to."""
        assert self.num_params is not None
        idle = (self.num_experts - self.experts_per_token) * self.expert_params
        return self.num_params - self.num_layers * idle

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts per layer that ``tokens`` tokens are routed to.

        Each token picks ``experts_per_token`` of ``num_experts``; with
        uniform, independent routing an expert is missed by all of them with
        probability ``(1 - k/E)^N``, so ``E·(1 - (1 - k/E)^N)`` experts are
        touched: ``k`` for one token, all ``E`` for large batches.
        """
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** max(tokens, 1.0))

    def weight_bytes(self, tp: int = 1) -> float:
        """Weight bytes held by each of ``tp`` tensor-parallel GPUs (every expert)."""
        assert self.num_params is not None
        return self.num_params * self.dtype_bytes / tp

    def weight_bytes_read(self, tokens: float, tp: int = 1) -> float:
        """Weight bytes a step of ``tokens`` tokens reads per GPU.

        A dense model reads every weight. An MoE model reads its shared
        weights and only the experts the step's tokens are routed to
        (:meth:`experts_touched`).
        """
        if not self.is_moe:
            return self.weight_bytes(tp)
        assert self.num_params is not None
        shared = self.num_params - self.num_layers * self.num_experts * self.expert_params
        experts = self.num_layers * self.experts_touched(tokens) * self.expert_params
        return (shared + experts) * self.dtype_bytes / tp

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each GPU holds: split over ``tp``, replicated when fewer than GPUs."""
        return max(1, self.num_kv_heads // tp) if tp > 1 else self.num_kv_heads

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token per GPU: 2 (K and V) x layers x KV heads x head dim x dtype."""
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes


Interconnect = Literal["nvlink", "pcie"]


@dataclass(frozen=True)
class GPUSpec:
    """An accelerator's peak figures.

    ``interconnect_bandwidth`` is the GPU-to-GPU bandwidth in one direction
    (NVLink, or the PCIe slot when the GPU has no NVLink); tensor-parallel
    all-reduces run over it. ``pcie_bandwidth`` is the host link used to
    swap KV blocks.
    """

    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    peak_flops: float  # dense FP16/BF16 tensor FLOP/s
    pcie_bandwidth: float = 25e9  # host<->device bytes/s, for swapping KV blocks
    interconnect: Interconnect = "pcie"
    interconnect_bandwidth: float = 32e9  # GPU<->GPU bytes/s, one direction
    #: the device's total memory as CUDA reports it (``torch.cuda.mem_get_info()[1]``, what
    #: vLLM multiplies by gpu_memory_utilization), when a public record gives it; the
    #: datasheet's "GB" are binary and the driver keeps a few hundred MiB of them
    cuda_memory_bytes: float | None = None

    @property
    def vllm_memory_bytes(self) -> float:
        """The total memory vLLM sizes its KV cache from: CUDA's figure, else the datasheet's."""
        return self.cuda_memory_bytes if self.cuda_memory_bytes is not None else \
            self.memory_bytes


# Architecture numbers from each model's public config.json on the Hugging Face hub
# (huggingface.co/<id>/blob/main/config.json): num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads, head_dim, intermediate_size (ffn_dim for OPT),
# num_local_experts / num_experts, num_experts_per_tok, moe_intermediate_size, vocab_size,
# max_position_embeddings, tie_word_embeddings. The parameter counts of the older presets are
# the published totals; the others are counted from the architecture.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 6.74e9, 32, 4096, 32, 32, 11008, 32000, 4096,
                  hf_id="meta-llama/Llama-2-7b-hf"),
        ModelSpec("llama-2-13b", 13.02e9, 40, 5120, 40, 40, 13824, 32000, 4096,
                  hf_id="meta-llama/Llama-2-13b-hf"),
        ModelSpec("llama-2-70b", 68.98e9, 80, 8192, 64, 8, 28672, 32000, 4096,
                  hf_id="meta-llama/Llama-2-70b-hf"),
        ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 14336, 128256, 131072,
                  hf_id="meta-llama/Llama-3.1-8B"),
        ModelSpec("llama-3.1-70b", 70.55e9, 80, 8192, 64, 8, 28672, 128256, 131072,
                  hf_id="meta-llama/Llama-3.1-70B"),
        ModelSpec("mistral-7b", 7.24e9, 32, 4096, 32, 8, 14336, 32000, 32768,
                  hf_id="mistralai/Mistral-7B-v0.1"),
        ModelSpec("qwen2.5-7b", 7.62e9, 28, 3584, 28, 4, 18944, 152064, 32768,
                  hf_id="Qwen/Qwen2.5-7B"),
        ModelSpec("qwen2.5-72b", 72.71e9, 80, 8192, 64, 8, 29568, 152064, 32768,
                  hf_id="Qwen/Qwen2.5-72B"),
        ModelSpec("opt-13b", 12.85e9, 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False,
                  tie_word_embeddings=True, hf_id="facebook/opt-13b"),
        # CodeLlama-34B: 48 layers, 8192 hidden, 64 heads / 8 KV heads, 22016 intermediate,
        # rope for 16,384 positions
        ModelSpec("codellama-34b", None, 48, 8192, 64, 8, 22016, 32000, 16384,
                  hf_id="codellama/CodeLlama-34b-Instruct-hf"),
        # Mixtral-8x7B: Mistral-7B's attention, 8 experts of 14336 per layer, 2 per token
        ModelSpec("mixtral-8x7b", None, 32, 4096, 32, 8, 14336, 32000, 32768,
                  num_experts=8, experts_per_token=2, moe_intermediate_size=14336,
                  hf_id="mistralai/Mixtral-8x7B-v0.1"),
        # Qwen3: head_dim 128 whatever hidden / heads is; 40,960 positions
        ModelSpec("qwen3-14b", None, 40, 5120, 40, 8, 17408, 151936, 40960, head_dim=128,
                  hf_id="Qwen/Qwen3-14B"),
        ModelSpec("qwen3-32b", None, 64, 5120, 64, 8, 25600, 151936, 40960, head_dim=128,
                  hf_id="Qwen/Qwen3-32B"),
        # Qwen3-30B-A3B: 128 experts of 768 per layer, 8 per token, no dense MLP layers
        ModelSpec("qwen3-30b-a3b", None, 48, 2048, 32, 4, 6144, 151936, 40960, head_dim=128,
                  num_experts=128, experts_per_token=8, moe_intermediate_size=768,
                  hf_id="Qwen/Qwen3-30B-A3B"),
    )
}

#: other names of model presets (Hugging Face ids, variants with the same architecture)
MODEL_ALIASES: dict[str, str] = {
    **{m.hf_id: m.name for m in MODELS.values() if m.hf_id},
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/Llama-2-13b-chat-hf": "llama-2-13b",
    "meta-llama/Llama-2-70b-chat-hf": "llama-2-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "codellama/CodeLlama-34b-hf": "codellama-34b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
}

# Datasheet figures (dense BF16 tensor throughput without sparsity, memory bandwidth,
# capacity, GPU-to-GPU link per direction):
# - A100 SXM4 40/80 GB: NVIDIA A100 datasheet (2021): 312 TFLOPS, 1,555 / 2,039 GB/s,
#   NVLink 3 600 GB/s both directions.
# - H100 SXM5 80 GB: NVIDIA H100 datasheet: 989 TFLOPS (1,979 with sparsity), 3.35 TB/s,
#   NVLink 4 900 GB/s both directions, PCIe Gen5.
# - H200 SXM 141 GB: NVIDIA H200 datasheet: 989 TFLOPS, 4.8 TB/s, NVLink 900 GB/s.
# - L40S 48 GB: NVIDIA L40S datasheet: 362.05 TFLOPS BF16 (733 with sparsity), 864 GB/s,
#   no NVLink, PCIe Gen4 x16 (64 GB/s both directions).
# - GeForce RTX 4090 24 GB: NVIDIA Ada Lovelace architecture whitepaper, appendix table:
#   165.2 TFLOPS BF16 with FP32 accumulate, 1,008 GB/s, PCIe Gen4 x16, no NVLink.
# - RTX PRO 6000 Blackwell 96 GB: NVIDIA RTX Blackwell GPU architecture whitepaper:
#   503.8 TFLOPS FP16/BF16 with FP32 accumulate, 1,792 GB/s GDDR7, PCIe Gen5 x16, no NVLink.
# - A10G 24 GB, L4 24 GB: AWS / NVIDIA datasheets (PCIe Gen4).
# Memory as CUDA reports it (cuda_memory_bytes; the presets' memory_bytes stay the datasheet
# figure in decimal GB, which memory sections and the roofline use):
# - H100 SXM5: 79.22 GiB, vLLM's memory-profiling log on an H100 80GB ("total_gpu_memory
#   79.22GiB", vllm-project/vllm#10511 and #12126).
# - RTX 4090: 25,250,627,584 bytes, torch.cuda.get_device_properties(0).total_memory in the
#   hardware record of LLMServingSim's RTX 4090 vLLM run (casys-kaist/LLMServingSim,
#   bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json); nvidia-smi shows 24,564 MiB.
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("a10g", 24 * GB, 600e9, 125e12, 16e9, "pcie", 32e9),
        GPUSpec("l4", 24 * GB, 300e9, 121e12, 16e9, "pcie", 32e9),
        GPUSpec("a100-40gb", 40 * GB, 1555e9, 312e12, 25e9, "nvlink", 300e9),
        GPUSpec("a100-80gb", 80 * GB, 2039e9, 312e12, 25e9, "nvlink", 300e9),
        GPUSpec("h100-sxm", 80 * GB, 3350e9, 989e12, 50e9, "nvlink", 450e9,
                round(79.22 * GiB)),
        GPUSpec("h200", 141 * GB, 4800e9, 989e12, 50e9, "nvlink", 450e9),
        GPUSpec("l40s", 48 * GB, 864e9, 362.05e12, 25e9, "pcie", 32e9),
        GPUSpec("rtx-4090", 24 * GB, 1008e9, 165.2e12, 25e9, "pcie", 32e9, 25_250_627_584),
        GPUSpec("rtx-pro-6000", 96 * GB, 1792e9, 503.8e12, 50e9, "pcie", 64e9),
    )
}

#: other names of GPU presets
GPU_ALIASES: dict[str, str] = {
    "h100-80gb": "h100-sxm",
    "h100": "h100-sxm",
    "a100": "a100-80gb",
    "rtxpro6000": "rtx-pro-6000",
    "rtx4090": "rtx-4090",
}


def get_model(name: str) -> ModelSpec:
    """The model preset ``name`` (short name or Hugging Face id); KeyError lists the known ones."""
    key = MODEL_ALIASES.get(name, name)
    if key not in MODELS:
        key = {k.lower(): v for k, v in MODEL_ALIASES.items()}.get(name.lower(), name.lower())
    try:
        return MODELS[key]
    except KeyError:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))}, or their "
                       "Hugging Face ids, a config.json path, or an inline model)") from None


def get_gpu(name: str) -> GPUSpec:
    """The GPU preset ``name``; KeyError lists the known ones."""
    key = GPU_ALIASES.get(name.lower(), name.lower())
    try:
        return GPUS[key]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r} (known: {', '.join(sorted(GPUS))})") from None


def dtype_bytes(dtype: str) -> int:
    """Bytes per parameter of ``dtype`` (``bfloat16``, ``float16``, ``float32``, ``fp8``)."""
    try:
        return DTYPE_BYTES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        raise KeyError(f"unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})"
                       ) from None


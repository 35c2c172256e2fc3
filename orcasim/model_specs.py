"""Model and GPU specs as a scenario gives them: a preset name, a ``config.json``, or inline.

``model:`` (in ``engine.latency`` of a roofline and in ``memory:``) takes

- a preset's short name or Hugging Face id (``llama-2-7b``,
  ``meta-llama/Llama-2-7b-hf``: :data:`orcasim.hardware.MODELS`);
- the path of a Hugging Face ``config.json`` (a path ending in ``.json``, or
  a directory holding ``config.json``), read by :func:`spec_from_hf_config`;
- an inline mapping (:class:`InlineModel`), dense or mixture-of-experts.

``gpu:`` takes a preset name or an inline mapping (:class:`InlineGPU`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from orcasim.hardware import (
    DTYPE_BYTES,
    GB,
    GPUSpec,
    Interconnect,
    ModelSpec,
    dtype_bytes,
    get_gpu,
    get_model,
)
from orcasim.params import ComponentParams
from orcasim.workload.base import field_error

#: the largest dimension (layers, hidden size, heads, experts...) a model may have
MAX_DIM = 10_000_000


class InlineModel(ComponentParams):
    """A model's shape written in the scenario (the fields of a Hugging Face config)."""

    name: str = Field("custom", description="label for messages")
    num_layers: int = Field(gt=0, le=MAX_DIM, description="decoder layers")
    hidden_size: int = Field(gt=0, le=MAX_DIM)
    num_heads: int = Field(gt=0, le=MAX_DIM, description="attention (query) heads")
    num_kv_heads: int | None = Field(None, gt=0, le=MAX_DIM, description="KV heads "
                                     "(default: num_heads)")
    head_dim: int | None = Field(None, gt=0, le=MAX_DIM, description="default: hidden_size / "
                                 "num_heads")
    intermediate_size: int = Field(gt=0, le=MAX_DIM, description="dense MLP width")
    vocab_size: int = Field(32000, gt=0, le=MAX_DIM)
    max_model_len: int = Field(4096, gt=0, le=MAX_DIM, description="longest sequence")
    num_experts: int = Field(0, ge=0, le=MAX_DIM, description="experts per layer (0: dense)")
    experts_per_token: int = Field(0, ge=0, le=MAX_DIM, description="experts each token is "
                                   "routed to")
    moe_intermediate_size: int | None = Field(None, gt=0, le=MAX_DIM, description="one "
                                              "expert's MLP width (default: "
                                              "intermediate_size)")
    dtype: str = Field("bfloat16", description="weight and KV dtype: " + ", ".join(DTYPE_BYTES))
    num_params: float | None = Field(None, gt=0, le=1e15, allow_inf_nan=False,
                                     description="total parameters (default: counted from "
                                     "the shape)")
    gated_mlp: bool = Field(True, description="gate, up and down projections (False: two, "
                            "as OPT)")
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> InlineModel:
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({kv})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not a multiple of num_heads "
                             f"({self.num_heads}): give head_dim")
        if (self.num_experts > 0) != (self.experts_per_token > 0):
            raise ValueError("give num_experts and experts_per_token together (both 0: dense)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) is more than "
                             f"num_experts ({self.num_experts})")
        try:
            dtype_bytes(self.dtype)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
        return self

    def spec(self) -> ModelSpec:
        """The :class:`ModelSpec` of this shape."""
        moe = self.num_experts > 0
        return ModelSpec(
            self.name, self.num_params, self.num_layers, self.hidden_size, self.num_heads,
            self.num_kv_heads or self.num_heads, self.intermediate_size, self.vocab_size,
            self.max_model_len, dtype_bytes(self.dtype), self.head_dim or 0,
            self.num_experts, self.experts_per_token,
            (self.moe_intermediate_size or self.intermediate_size) if moe else 0,
            self.gated_mlp, self.tie_word_embeddings)


class InlineGPU(ComponentParams):
    """A GPU's datasheet figures written in the scenario."""

    name: str = Field("custom", description="label for messages")
    memory_gb: float = Field(gt=0, le=1e6, allow_inf_nan=False, description="memory, GB")
    hbm_bandwidth: float = Field(gt=0, le=1e16, allow_inf_nan=False, description="memory "
                                 "bandwidth, bytes/s")
    peak_flops: float = Field(gt=0, le=1e18, allow_inf_nan=False, description="dense BF16 "
                              "tensor FLOP/s")
    interconnect: Interconnect = Field("pcie", description="nvlink or pcie: what all-reduces "
                                       "run over")
    interconnect_bandwidth: float = Field(32e9, gt=0, le=1e15, allow_inf_nan=False,
                                          description="GPU-to-GPU bytes/s, one direction")
    pcie_bandwidth: float = Field(25e9, gt=0, le=1e15, allow_inf_nan=False,
                                  description="host<->device bytes/s (KV swapping)")

    def spec(self) -> GPUSpec:
        return GPUSpec(self.name, self.memory_gb * GB, self.hbm_bandwidth, self.peak_flops,
                       self.pcie_bandwidth, self.interconnect, self.interconnect_bandwidth)


def _inline(cls: type[ComponentParams]) -> Any:
    """A before-validator: a mapping becomes ``cls``, its errors located at its own fields."""

    def validate(v: Any) -> Any:
        if isinstance(v, dict):
            try:
                return cls.model_validate(v)
            except ValidationError as e:
                err = e.errors()[0]
                raise field_error(tuple(err["loc"]), err["msg"].removeprefix("Value error, "),
                                  err.get("input")) from None
        return v

    return BeforeValidator(validate)


#: a scenario's ``model:``: preset name, Hugging Face id, config.json path, or inline shape
ModelRef = Annotated[str | InlineModel, _inline(InlineModel)]
#: a scenario's ``gpu:``: preset name or inline figures
GPURef = Annotated[str | InlineGPU, _inline(InlineGPU)]

# Hugging Face config keys, in the order they are tried
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_model_len": ("max_position_embeddings", "n_positions", "max_seq_len"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "tie_word_embeddings": ("tie_word_embeddings",),
}


def spec_from_hf_config(path: str | Path) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face ``config.json`` (or a directory holding one).

    Reads the fields :data:`_HF_KEYS` names; the dtype from ``torch_dtype``
    (or ``dtype``; default bfloat16); a multimodal config's ``text_config``.
    OPT-style configs (``ffn_dim``, ``do_layer_norm_before``) get a two-matrix
    MLP. Raises ``ValueError`` naming the file for a missing or malformed
    field.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    return _read_hf_config(str(p.resolve()), p.stat().st_mtime_ns if p.exists() else 0)


@functools.lru_cache(maxsize=32)
def _read_hf_config(path: str, _stamp: int) -> ModelSpec:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: model config file not found")
    try:
        cfg = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: not a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    fields: dict[str, Any] = {}
    for name, keys in _HF_KEYS.items():
        for k in keys:
            if cfg.get(k) is not None:
                fields[name] = cfg[k]
                break
    for required in ("num_layers", "hidden_size", "num_heads", "intermediate_size"):
        if required not in fields:
            raise ValueError(f"{path}: no {' or '.join(_HF_KEYS[required])} in the config")
    if fields.get("moe_intermediate_size") is None and fields.get("num_experts"):
        fields["moe_intermediate_size"] = fields["intermediate_size"]
    if not fields.get("num_experts"):
        fields.pop("experts_per_token", None)
        fields.pop("moe_intermediate_size", None)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    opt_style = "ffn_dim" in cfg and "intermediate_size" not in cfg
    name = cfg.get("_name_or_path") or p.parent.name or "config"
    try:
        return InlineModel(name=str(name), dtype=str(dtype), gated_mlp=not opt_style,
                           **fields).spec()
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{path}: {where + ': ' if where else ''}{msg}") from None


def resolve_model(ref: str | InlineModel | ModelSpec) -> ModelSpec:
    """The :class:`ModelSpec` a scenario's ``model:`` names; ValueError if it names none."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, InlineModel):
        return ref.spec()
    try:
        return get_model(ref)
    except KeyError as e:
        if ref.endswith(".json") or _is_dir(ref):
            return spec_from_hf_config(ref)
        raise ValueError(e.args[0]) from None


def _is_dir(name: str) -> bool:
    """Whether ``name`` is a directory; False for a name the system cannot look up (too long)."""
    try:
        return Path(name).is_dir()
    except OSError:
        return False


def resolve_gpu(ref: str | InlineGPU | GPUSpec) -> GPUSpec:
    """The :class:`GPUSpec` a scenario's ``gpu:`` names; ValueError if it names none."""
    if isinstance(ref, GPUSpec):
        return ref
    if isinstance(ref, InlineGPU):
        return ref.spec()
    try:
        return get_gpu(ref)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def model_label(ref: str | InlineModel) -> str:
    """How messages name the model of ``ref``."""
    return ref if isinstance(ref, str) else ref.name


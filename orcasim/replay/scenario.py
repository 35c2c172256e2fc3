"""The scenario a replay runs, built from a measured run's engine arguments.

The replay is a convenience: it writes an ordinary scenario (``scenario.yaml``
in the output directory) and runs it, so the same prediction can be made by
hand. The mapping from vLLM's engine arguments (``meta.json`` ->
``engine_kwargs``) is:

- ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size`` (16),
  ``enable_prefix_caching`` (on), ``enable_chunked_prefill`` (on) ->
  the ``vllm-v1`` policy; values in brackets are vLLM V1's defaults, used when
  the argument is absent or null;
- ``async_scheduling``: vLLM's default since 0.12 (vllm-project/vllm#27614,
  "Enable async scheduling by default") is on, off before;
- ``max_model_len``: the model's context length when null;
- ``long_prefill_token_threshold`` when set;
- KV blocks: ``--num-gpu-blocks``, else ``num_gpu_blocks`` when the run
  recorded it, otherwise the ``memory`` section sizes the cache as vLLM 0.19
  does (``Worker.determine_available_memory``): the device's total memory as
  CUDA reports it x ``gpu_memory_utilization`` (0.9), less the weights and the
  memory vLLM's start-up profiling measures besides them (:func:`kv_memory`);
- ``tensor_parallel_size`` -> the profile's ``tp<N>`` folder (or the roofline's tp);
- the profile model's per-step CPU time: the gap between steps that vLLM's
  developers measured with and without async scheduling (see ``STEP_GAP_*``);
- at tp > 1, the profile model's all-reduce: a PCIe link (``ALLREDUCE_PCIE_*``;
  change ``engine.latency.allreduce_*`` in the written scenario for NVLink);
- the profile model's CUDA-graph padding: vLLM's default capture sizes for the
  run's ``max_num_seqs`` and ``max_num_batched_tokens``
  (:func:`default_capture_sizes`), none with ``enforce_eager``;
- an MoE model's experts and experts per token from its preset;
- ``data_parallel_size`` > 1: that many engines (a ``cluster`` of replicas,
  each with the run's policy, latency model and KV cache) behind the
  ``least_outstanding`` router with a live view (:data:`DP_ROUTER`); for an
  MoE model the group steps in lockstep (``lockstep: true``,
  :mod:`orcasim.cluster.lockstep`): vLLM runs an MoE model's DP ranks as
  ``DPEngineCoreProc`` engines that step together, a dense model's as
  independent engines (``EngineCoreProc.run_engine_core``,
  ``vllm/v1/engine/core.py``);
- ``enable_expert_parallel`` with an MoE model: the profile model's
  ``expert_parallel`` = ``data_parallel_size`` x ``tensor_parallel_size``
  (TP1 engines only), with the same PCIe link for the token gathers; the
  roofline costs each engine as if it held every expert.

Each argument is read from vLLM's resolved configuration when the run
recorded it (``resolved_config`` and ``kv_cache`` in ``meta.json``), else from
``engine_kwargs`` (:class:`EngineArgs`).

The workload is the token-id trace itself (``format: tokens``), hashed per
KV block as vLLM hashes it. The per-step series keeps every step
(``output.series_capacity``, :data:`SERIES_CAPACITY`), from which the replay
reads where each predicted TTFT starts (:mod:`orcasim.replay.queued`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orcasim.errors import UsageError
from orcasim.hardware import GB, MODELS, GiB, ModelSpec, get_gpu, get_model

#: vLLM V1 scheduler defaults used when the run does not record an argument
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: the first vLLM release with async scheduling on by default
ASYNC_DEFAULT_SINCE = (0, 12)
#: CPU time per step left on the critical path, s, for the profile model (whose tables hold
#: GPU time only). With async scheduling the scheduler and input preparation overlap the
#: forward pass and the gap between steps measured 150-170 us (batch 256, CUDA graphs;
#: vllm-project/vllm#11133); without it the gap was 5-6 ms (Llama-2-7B, batch 256, ShareGPT;
#: vllm-project/vllm#10634).
STEP_GAP_ASYNC_S = 160e-6
STEP_GAP_SYNC_S = 5.5e-3
#: all-reduce between tensor-parallel GPUs over PCIe (no NVLink): the link LLMServingSim's
#: validated RTX PRO 6000 TP2 configuration uses (link_bw 16 GB/s, link_latency 20 us;
#: bench/examples/RTXPRO6000/Qwen3-32B/config.json in casys-kaist/LLMServingSim)
ALLREDUCE_PCIE_BANDWIDTH = 16e9
ALLREDUCE_PCIE_LATENCY_S = 20e-6
#: rows of the per-step series: enough to keep every step of a replayed run apart (the
#: series is bounded by time bins past this), so that each request's simulated
#: ``queued_ts`` can be read from the steps in flight (:mod:`orcasim.replay.queued`)
SERIES_CAPACITY = 1 << 20


#: what a vLLM instance keeps on each GPU besides the weights and the KV cache, GiB, when the
#: run does not record its KV blocks. vLLM measures it at start-up as the PyTorch activation
#: peak of a profiling forward pass plus the memory allocated outside PyTorch since its first
#: snapshot (vllm/v1/worker/gpu_worker.py, determine_available_memory; CUDA-graph memory is
#: not subtracted unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set). The figures are the
#: ones vLLM's developers logged for an 8B Llama on an H100: activation peak 1.26 GiB
#: (Meta-Llama-3-8B, vllm-project/vllm#10511) and 0.16 GiB outside PyTorch
#: (vllm-project/vllm#12126).
KV_RESERVE_GIB = 1.26 + 0.16

#: how vLLM spreads requests over ``data_parallel_size`` engines behind one front end
#: (``DPLBAsyncMPClient.get_core_engine_for_request``, vllm/v1/engine/core_client.py): the
#: engine with the lowest ``4 x waiting + running``, ties to the lowest index, counting each
#: request it sends at once (the engines' own counts arrive every 100 ms). Fewest outstanding
#: (waiting + running) on a live view picks the same engine whenever the engines' running
#: counts are equal or nothing waits, the two states a DP run is in almost all the time.
DP_ROUTER = {"type": "least_outstanding"}


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """The token counts vLLM V1 captures CUDA graphs for when none are configured.

    ``VllmConfig._set_cudagraph_sizes`` (vllm/config/vllm.py): the largest is
    ``min(2 * max_num_seqs, 512, max_num_batched_tokens)`` (no speculative
    decoding); below it 1, 2, 4, then multiples of 8 up to 248, then
    multiples of 16 from 256.
    """
    top = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += [s for s in range(8, 256, 8) if s <= top]
    sizes += list(range(256, top + 1, 16))
    return sizes


def model_preset(name: str) -> ModelSpec | None:
    """The model preset for a Hugging Face id (``meta-llama/Llama-3.1-8B`` -> ``llama-3.1-8b``)."""
    base = name.rsplit("/", 1)[-1].lower()
    for key in (name, name.lower(), base, base.removesuffix("-hf"),
                base.removesuffix("-instruct")):
        try:
            return get_model(key)
        except KeyError:
            continue
    return None


def _version(text: Any) -> tuple[int, ...]:
    found = re.match(r"(\d+)\.(\d+)", str(text or ""))
    return (int(found.group(1)), int(found.group(2))) if found else ()


#: where each engine argument may be recorded besides ``engine_kwargs``: sections of
#: ``resolved_config`` (vLLM's VllmConfig after boot), then ``kv_cache``
SECTIONS = {
    "max_num_seqs": ("scheduler_config",),
    "max_num_batched_tokens": ("scheduler_config",),
    "max_model_len": ("scheduler_config", "model_config"),
    "async_scheduling": ("scheduler_config",),
    "enable_chunked_prefill": ("scheduler_config",),
    "long_prefill_token_threshold": ("scheduler_config",),
    "block_size": ("cache_config", "kv_cache"),
    "enable_prefix_caching": ("cache_config", "kv_cache"),
    "gpu_memory_utilization": ("cache_config", "kv_cache"),
    "num_gpu_blocks": ("cache_config", "kv_cache"),
    "tensor_parallel_size": ("parallel_config",),
    "data_parallel_size": ("parallel_config",),
    "enable_expert_parallel": ("parallel_config",),
    "enforce_eager": ("model_config",),
}


class EngineArgs:
    """The run's engine arguments: what vLLM resolved when recorded, else what was asked.

    Newer run directories record vLLM's resolved configuration
    (``resolved_config``, one section per sub-config, and ``kv_cache``):
    the values the engine actually ran with, defaults filled in. Those win
    over ``engine_kwargs`` (the arguments given, ``null`` where left to vLLM).
    """

    def __init__(self, meta: dict[str, Any], where: str) -> None:
        self.meta = meta
        self.where = where
        kw = meta.get("engine_kwargs")
        self.kwargs: dict[str, Any] = kw if isinstance(kw, dict) else {}
        rc = meta.get("resolved_config")
        self.resolved: dict[str, Any] = rc if isinstance(rc, dict) else {}

    def get(self, key: str, default: Any = None) -> Any:
        """The recorded value of ``key`` (None-valued records skipped), else ``default``."""
        for section in SECTIONS.get(key, ()):
            block = self.meta.get("kv_cache") if section == "kv_cache" else \
                self.resolved.get(section)
            if isinstance(block, dict) and block.get(key) is not None:
                return block[key]
        v = self.kwargs.get(key, self.meta.get(key))
        return default if v is None else v

    def positive_int(self, key: str, default: int) -> int:
        v = self.get(key, default)
        if type(v) is not int or v < 1:
            raise UsageError(f"{self.where}: {key} must be a whole number >= 1, got {v!r}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise UsageError(f"{self.where}: {key} must be true or false, got {v!r}")
        return v


def num_gpu_blocks(meta: dict[str, Any]) -> int | None:
    """The KV blocks the run's engine allocated, when ``meta.json`` records them."""
    args = EngineArgs(meta, "meta.json")
    for v in (args.get("num_gpu_blocks"), args.kwargs.get("num_gpu_blocks_override")):
        if type(v) is int and v >= 2:
            return v
    return None


def profile_gpu(profiles: Path | None) -> str | None:
    """The GPU preset the operator profiles were taken on (meta.yaml ``hardware`` or ``gpu``)."""
    if profiles is None:
        return None
    from orcasim.latency.profile import read_meta

    meta = read_meta(profiles)
    for key in ("hardware", "gpu"):
        name = meta.get(key)
        if isinstance(name, str):
            try:
                return get_gpu(name).name
            except KeyError:
                continue
    return None


def kv_memory(meta: dict[str, Any], where: str, *, gpu_memory_gb: float | None,
              gpu: str | None, profiles: Path | None) -> tuple[float, str]:
    """The GPU memory (bytes) vLLM sized the KV cache from, and where the figure comes from.

    vLLM multiplies the total memory CUDA reports (``torch.cuda.mem_get_info``)
    by ``gpu_memory_utilization`` (vllm/v1/worker/utils.py, request_memory).
    In order: ``--gpu-memory-gb`` (GiB, the unit of GPU datasheets' capacities
    and of vLLM's memory log); the total the run recorded
    (``hardware.device_total_memory_bytes`` in meta.json); the preset of
    ``--gpu``, else of the GPU the profiles were taken on, at the total CUDA
    reports for it where a public record gives it (``GPUSpec.cuda_memory_bytes``),
    else its datasheet capacity.
    """
    if gpu_memory_gb is not None:
        return gpu_memory_gb * GiB, f"--gpu-memory-gb {gpu_memory_gb:g} (GiB)"
    hw = meta.get("hardware")
    if isinstance(hw, dict) and hw.get("device_total_memory_bytes") is not None:
        v = hw["device_total_memory_bytes"]
        if type(v) is not int or v < 1:
            raise UsageError(f"{where}: hardware.device_total_memory_bytes must be a whole "
                             f"number of bytes, got {v!r}")
        return float(v), "the run's hardware.device_total_memory_bytes"
    name = gpu or profile_gpu(profiles)
    if name is None:
        raise UsageError(f"{where}: the run records no num_gpu_blocks and no "
                         "device_total_memory_bytes, and the profiles name no known GPU: give "
                         "--gpu-memory-gb (the GPU's memory as CUDA reports it) or "
                         "--num-gpu-blocks to size the KV cache")
    spec = get_gpu(name)
    kind = "CUDA's total" if spec.cuda_memory_bytes is not None else "datasheet capacity"
    return spec.vllm_memory_bytes, f"the {spec.name} preset's {kind}"


def build_scenario(
    meta: dict[str, Any],
    where: str,
    workload: Path,
    *,
    profiles: Path | None,
    gpu: str | None = None,
    gpu_memory_gb: float | None = None,
    max_request_len: int = 0,
    num_gpu_blocks_override: int | None = None,
    kv_reserve_gb: float | None = None,
) -> dict[str, Any]:
    """The scenario (a plain dict, as written to YAML) replaying a run with ``meta``.

    ``profiles`` selects the ``profile`` latency model (a profile directory);
    without it ``gpu`` (a GPU preset) selects the ``roofline``. ``where``
    names meta.json in errors; ``max_request_len`` (the longest prompt +
    output of the workload) bounds ``max_model_len`` when the model is not
    a preset. ``num_gpu_blocks_override`` fixes the KV blocks;
    ``kv_reserve_gb`` replaces :data:`KV_RESERVE_GIB` when the cache is sized
    from memory.
    """
    args = EngineArgs(meta, where)
    model_name = str(meta.get("model") or args.kwargs.get("model") or "")
    preset = model_preset(model_name)
    tp = args.positive_int("tensor_parallel_size", 1)
    dp = args.positive_int("data_parallel_size", 1)
    ep = dp * tp if args.flag("enable_expert_parallel", False) and preset is not None \
        and preset.is_moe else 1
    block_size = args.positive_int("block_size", 16)
    fallback_len = preset.max_model_len if preset is not None else max(max_request_len, 2)
    policy: dict[str, Any] = {
        "type": "vllm-v1",
        "max_num_seqs": args.positive_int("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        "max_num_batched_tokens": args.positive_int("max_num_batched_tokens",
                                                    DEFAULT_MAX_NUM_BATCHED_TOKENS),
        "max_model_len": args.positive_int("max_model_len", fallback_len),
        "block_size": block_size,
        "enable_prefix_caching": args.flag("enable_prefix_caching", True),
        "enable_chunked_prefill": args.flag("enable_chunked_prefill", True),
        "async_scheduling": args.flag("async_scheduling", _version(
            meta.get("vllm_version")) >= ASYNC_DEFAULT_SINCE),
    }
    threshold = args.get("long_prefill_token_threshold", 0)
    if type(threshold) is int and threshold > 0:
        policy["long_prefill_token_threshold"] = threshold
    max_len = policy["max_model_len"]
    scenario: dict[str, Any] = {
        "name": "replay",
        "description": f"replay of a measured vLLM run of {model_name or 'a model'}",
        "workload": {"type": "trace", "file": str(workload), "format": "tokens",
                     "hash_block_size": block_size},
        "engine": {"latency": _latency(profiles, gpu, preset, model_name, tp, ep)},
        "policy": policy,
        # every step's span, not time bins: where each predicted TTFT starts
        # (orcasim.replay.queued)
        "output": {"series_capacity": SERIES_CAPACITY},
    }
    if dp > 1:
        group: dict[str, Any] = {"name": "dp", "count": dp}
        if preset is not None and preset.is_moe:
            group["lockstep"] = True
        scenario["cluster"] = {"router": dict(DP_ROUTER), "staleness": 0, "groups": [group]}
    if profiles is not None:
        latency = scenario["engine"]["latency"]
        latency["overhead_s"] = (
            STEP_GAP_ASYNC_S if policy["async_scheduling"] else STEP_GAP_SYNC_S)
        if not args.flag("enforce_eager", False):
            latency["cudagraph_capture_sizes"] = default_capture_sizes(
                policy["max_num_seqs"], policy["max_num_batched_tokens"])
    blocks = num_gpu_blocks_override or num_gpu_blocks(meta)
    if blocks is not None:
        policy["num_blocks"] = blocks
    else:
        if preset is None:
            raise UsageError(f"{where}: the run records no num_gpu_blocks and model "
                             f"{model_name!r} is not a preset, so the KV cache cannot be sized "
                             f"(known models: {', '.join(sorted(MODELS))}); give "
                             "--num-gpu-blocks")
        total, _ = kv_memory(meta, where, gpu_memory_gb=gpu_memory_gb, gpu=gpu,
                             profiles=profiles)
        reserve = (kv_reserve_gb if kv_reserve_gb is not None else KV_RESERVE_GIB) * GiB / GB
        scenario["memory"] = {
            "model": preset.name, "tp": tp, "block_size": block_size,
            "gpu_memory_gb": total / GB,
            "gpu_memory_utilization": float(args.get("gpu_memory_utilization", 0.9)),
            "activation_reserve_gb": reserve,
            "max_model_len": int(max_len)}
    return scenario


def _latency(profiles: Path | None, gpu: str | None, preset: ModelSpec | None,
             model_name: str, tp: int, ep: int = 1) -> dict[str, Any]:
    if ep > 1 and profiles is not None and tp > 1:
        raise UsageError(f"expert parallelism over {ep} GPUs is modelled for TP1 engines "
                         f"only; the run has tensor_parallel_size {tp}")
    if profiles is not None:
        latency: dict[str, Any] = {"type": "profile", "dir": str(profiles), "tp": tp}
        if preset is not None:
            latency["num_layers"] = preset.num_layers
            if preset.is_moe:
                latency["num_experts"] = preset.num_experts
                latency["experts_per_token"] = preset.experts_per_token
        if ep > 1:
            latency["expert_parallel"] = ep
        if tp > 1 or ep > 1:
            if preset is not None:
                latency["hidden_size"] = preset.hidden_size
            latency["allreduce_bandwidth"] = ALLREDUCE_PCIE_BANDWIDTH
            latency["allreduce_latency"] = ALLREDUCE_PCIE_LATENCY_S
        return latency
    if gpu is None:
        raise UsageError("give --profiles (operator profiles of the GPU) or --gpu (a GPU "
                         "preset, for the roofline model)")
    if preset is None:
        raise UsageError(f"the roofline needs a model preset; {model_name!r} is not one "
                         f"(known: {', '.join(sorted(MODELS))})")
    return {"type": "roofline", "model": preset.name, "gpu": gpu, "tp": tp}

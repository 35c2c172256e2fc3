"""Model and GPU specs: presets by name and Hugging Face id, config.json, inline shapes, MoE, TP."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import orcasim
from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.hardware import GPUS, MODELS, get_gpu, get_model
from orcasim.kv.config import MemoryOptions, kv_blocks, resolve
from orcasim.latency.op_calibration import (
    allreduce_fit,
    dense_profile_efficiencies,
    gemm_efficiencies,
)
from orcasim.latency.op_calibration import main as main_calibration
from orcasim.model_specs import resolve_model, spec_from_hf_config
from orcasim.plan import StepPlan
from orcasim.registry import latency_models
from orcasim.spec import build_spec

IDEAL = {"compute_efficiency": 1.0, "bandwidth_efficiency": 1.0, "overhead": 0.0}

# Qwen/Qwen3-30B-A3B's config.json (the fields a simulator reads, as published)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def roofline(**kw):
    return build_spec(latency_models, {"type": "roofline", **kw}, "engine.latency").create()


def test_presets_answer_to_hugging_face_ids_and_short_names():
    assert get_model("meta-llama/Llama-2-7b-hf") is MODELS["llama-2-7b"]
    assert get_model("Qwen/Qwen3-30B-A3B") is get_model("qwen3-30b-a3b")
    assert get_model("mistralai/Mixtral-8x7B-v0.1").name == "mixtral-8x7b"
    assert get_model("codellama/CodeLlama-34b-Instruct-hf").num_layers == 48
    assert get_model("facebook/opt-13b") is MODELS["opt-13b"]
    for hf in ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-3.1-8B",
               "meta-llama/Llama-3.1-70B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B"):
        assert get_model(hf).hf_id == hf
    assert get_gpu("h100-80gb") is GPUS["h100-sxm"]  # the old name stays
    for g in ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "l40s", "rtx-4090", "rtx-pro-6000"):
        assert get_gpu(g).name == g
    assert (get_gpu("h100-sxm").interconnect, get_gpu("rtx-pro-6000").interconnect) == (
        "nvlink", "pcie")
    with pytest.raises(KeyError, match="unknown model 'gpt-5'"):
        get_model("gpt-5")


def test_dense_model_flops_bytes_and_kv_by_hand():
    """Qwen3-32B: head_dim 128, not 5120 / 64 = 80."""
    m = get_model("Qwen/Qwen3-32B")
    assert m.head_dim == 128
    attn = 5120 * 128 * (64 + 2 * 8) + 64 * 128 * 5120  # q, k, v and o projections
    mlp = 3 * 5120 * 25600
    per_layer = attn + mlp + 2 * 5120
    total = 151936 * 5120 * 2 + 64 * per_layer + 5120
    assert total == 32_762_106_880
    assert m.num_params == total and m.active_params == total
    assert m.kv_bytes_per_token() == 2 * 64 * 8 * 128 * 2 == 262_144
    assert m.kv_bytes_per_token(tp=2) == 131_072
    cost = roofline(model="Qwen/Qwen3-32B", gpu="rtx-pro-6000", tp=2, **IDEAL).cost
    assert cost.flops_per_token == 2 * total
    assert cost.attn_flops_per_pair == 4 * 64 * 64 * 128
    flops, mem, comm = cost.terms(StepPlan(1, 100))  # one decode, 100 cached tokens
    assert flops == (2 * total + 4 * 64 * 64 * 128 * 101) / 2
    assert mem == total * 2 / 2 + 131_072 * 101
    assert comm == 2 * 64 * 5120 * 2 * 2 * (1 / 2)


def test_moe_model_computes_active_experts_and_reads_touched_ones():
    """Mixtral-8x7B: 8 experts of 14,336 per layer, 2 per token."""
    m = get_model("mistralai/Mixtral-8x7B-v0.1")
    expert = 3 * 4096 * 14336
    attn = 4096 * 128 * (32 + 16) + 32 * 128 * 4096
    per_layer = attn + 8 * expert + 4096 * 8 + 2 * 4096  # experts, router, norms
    total = 32000 * 4096 * 2 + 32 * per_layer + 4096
    assert m.num_params == total == 46_702_792_704
    active = total - 32 * 6 * expert
    assert m.active_params == active == 12_879_925_248
    assert m.experts_touched(1) == 2 and m.experts_touched(2) == 8 * (1 - 0.75**2) == 3.5
    shared = total - 32 * 8 * expert
    assert m.weight_bytes_read(1) == (shared + 32 * 2 * expert) * 2 == active * 2
    assert m.weight_bytes_read(2, tp=2) == (shared + 32 * 3.5 * expert) * 2 / 2
    assert m.weight_bytes_read(10_000) == pytest.approx(m.weight_bytes(), rel=1e-12)
    lat = roofline(model="mixtral-8x7b", gpu="h100-sxm", tp=2, **IDEAL)
    flops, mem, _ = lat.cost.terms(StepPlan(1, 0))
    assert flops == (2 * active + 4 * 32 * 32 * 128) / 2  # computed as 12.9B, not 46.7B
    assert mem == active * 2 / 2 + m.kv_bytes_per_token(2)
    assert lat.step_time(StepPlan(1, 0)) == pytest.approx(
        mem / 3.35e12 + 2 * 32 * 4096 * 2 * 2 * 0.5 / (450e9 * 0.75) + 2 * 32 * 5e-6,
        rel=1e-12)


def test_hugging_face_config_json_gives_the_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    spec = spec_from_hf_config(path)
    preset = get_model("qwen3-30b-a3b")
    assert replace(spec, name=preset.name) == preset  # every architecture field is equal
    per_layer = (2048 * 128 * (32 + 8) + 32 * 128 * 2048  # attention
                 + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 2048)  # experts, router, norms
    total = 151936 * 2048 * 2 + 48 * per_layer + 2048
    assert spec.num_params == preset.num_params == total == 30_532_110_336
    assert spec.active_params == total - 48 * 120 * 3 * 2048 * 768 == 3_353_020_416  # A3B
    assert spec_from_hf_config(tmp_path) == spec  # the directory holding config.json
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [{"prompt_len": 8, "output_len": 2}]},
        "engine": {"latency": {"type": "roofline", "model": str(path), "gpu": "rtx-pro-6000"}},
        "memory": {"model": str(path), "gpu": "rtx-pro-6000"},
        "policy": "continuous"})
    lay = resolve(sc.variants[0].memory)
    # (0.9 x 96 GB - 61.06 GB of weights) / (16 tokens x 2 x 48 x 4 x 128 x 2 bytes)
    assert lay.bytes_per_token == 98_304
    assert lay.num_blocks == int((0.9 * 96e9 - total * 2) // (16 * 98_304))
    assert lay.max_model_len == 40960


def test_inline_models_and_gpus_in_a_scenario():
    model = {"name": "tiny-moe", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
             "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 128, "num_experts": 4,
             "experts_per_token": 1, "vocab_size": 100, "dtype": "float32"}
    gpu = {"memory_gb": 1, "hbm_bandwidth": 1e9, "peak_flops": 1e12, "interconnect": "nvlink",
           "interconnect_bandwidth": 4e9}
    lat = roofline(model=model, gpu=gpu, tp=2, **IDEAL)
    m = lat.cost.model
    assert (m.head_dim, m.moe_intermediate_size, m.dtype_bytes) == (32, 128, 4)
    assert m.num_params == 100 * 64 * 2 + 2 * (64 * 32 * 8 + 4 * 32 * 64 + 4 * 3 * 64 * 128
                                                + 64 * 4 + 128) + 64
    assert lat.allreduce_rate == 4e9 * 0.75
    lay = resolve(MemoryOptions(model=model, gpu=gpu, tp=2))
    assert lay.bytes_per_token == 2 * 2 * 1 * 32 * 4


@pytest.mark.parametrize("latency,field,msg", [
    ({"model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 8,
                "num_experts": 4}}, "engine.latency.model",
     "give num_experts and experts_per_token together"),
    ({"model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4}},
     "engine.latency.model.intermediate_size", "Field required"),
    ({"model": {"num_layers": 2, "hidden_size": 60, "num_heads": 8, "intermediate_size": 8}},
     "engine.latency.model", "hidden_size (60) is not a multiple of num_heads (8): give head_dim"),
    ({"model": "missing/config.json"}, "engine.latency", "model config file not found"),
    ({"gpu": {"memory_gb": 0, "hbm_bandwidth": 1, "peak_flops": 1}},
     "engine.latency.gpu.memory_gb", "greater than 0"),
    ({"model": "Qwen/Qwen3-32B", "gpu": "rtx-4090"}, "engine.latency",
     "Qwen/Qwen3-32B needs 65.5 GB of weights per GPU at tp=1; a rtx-4090 has 24 GB"),
])
def test_bad_specs_are_one_line_scenario_errors(latency, field, msg):
    with pytest.raises(ScenarioError) as exc:
        build_spec(latency_models, {"type": "roofline", **latency}, "engine.latency")
    assert exc.value.field == field
    assert msg in exc.value.message


def test_bad_config_json_exits_2(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64}))
    sc = tmp_path / "s.yaml"
    sc.write_text(f"workload: {{type: list, requests: [{{prompt_len: 1, output_len: 1}}]}}\n"
                  f"policy: continuous\nmemory: {{model: {cfg}, gpu: h100-sxm}}\n")
    assert main(["run", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "no num_hidden_layers or n_layer or num_layers in the config" in err


def test_memory_from_model_gpu_tp_like_vllm():
    # Llama-2-7B on an H100: (0.9 x 80 GB - 13.48 GB) / (16 x 512 KiB)
    assert kv_blocks("meta-llama/Llama-2-7b-hf", get_gpu("h100-sxm").memory_bytes) == int(
        (0.9 * 80e9 - 6.74e9 * 2) // (16 * 524_288)) == 6976
    # Llama-2-70B on 4 H100s: 8 KV heads, 2 per GPU
    lay = resolve(MemoryOptions(model="meta-llama/Llama-2-70b-hf", gpu="h100-sxm", tp=4,
                                activation_reserve_gb=2))
    assert lay.bytes_per_token == 2 * 80 * 2 * 128 * 2
    assert lay.num_blocks == int((0.9 * 80e9 - 68.98e9 * 2 / 4 - 2e9) // (16 * 81_920))


def test_interconnect_sets_the_all_reduce_cost():
    nvlink = roofline(model="llama-3.1-8b", gpu="h100-sxm", tp=2)
    pcie = roofline(model="llama-3.1-8b", gpu="rtx-pro-6000", tp=2)
    assert nvlink.allreduce_rate == 450e9 * 0.75
    assert pcie.allreduce_rate == 64e9 * 0.75
    given = roofline(model="llama-3.1-8b", gpu="rtx-pro-6000", tp=2, allreduce_bandwidth=1e10)
    assert given.allreduce_rate == 1e10
    plan = StepPlan(4, 400)
    assert pcie.breakdown(plan)["comm"] == 2 * 32 * 4 * 4096 * 2 * 2 * 0.5 / 48e9


def test_resolve_model_passes_specs_through():
    m = get_model("llama-2-7b")
    assert resolve_model(m) is m and resolve_model("LLAMA-2-7B") is m


VIDUR_MLP = (
    "time_stats.attn_pre_proj.median,time_stats.attn_post_proj.median,"
    "time_stats.mlp_up_proj.median,time_stats.mlp_down_proj.median,n_head,n_kv_head,n_embd,"
    "n_expanded_embd,use_gated_mlp,num_tokens,num_tensor_parallel_workers\n"
    "0.1,0.1,0.1,0.1,4,4,64,128,True,1,1\n"
    "0.2,0.2,0.2,0.2,4,4,64,128,True,4096,1\n"
    "9,9,9,9,4,4,64,128,True,4096,2\n"
)


def test_efficiencies_come_from_operator_profiles(tmp_path, capsys):
    path = tmp_path / "mlp.csv"
    path.write_text(VIDUR_MLP)
    e = gemm_efficiencies(path, "h100-sxm")
    weights = 64 * (4 + 8) * 16 + 4 * 16 * 64 + 2 * 64 * 128 + 128 * 64  # qkv, o, gate+up, down
    assert e.compute_efficiency == pytest.approx(2 * 4096 * weights / 0.8e-3 / 989e12, rel=1e-12)
    assert e.bandwidth_efficiency == pytest.approx(weights * 2 / 0.4e-3 / 3350e9, rel=1e-12)
    ar = tmp_path / "all_reduce.csv"
    ar.write_text(",time_stats.all_reduce.median,num_workers,size\n"
                  f"0,{(1e-5 + 2**23 * 1.5 / 3e11) * 1e3!r},4,{2**23}\n"
                  f"1,{(1e-5 + 2**24 * 1.5 / 3e11) * 1e3!r},4,{2**24}\n")
    lat, bw = allreduce_fit(ar, 4)
    assert lat == pytest.approx(1e-5, rel=1e-9) and bw == pytest.approx(3e11, rel=1e-9)
    assert main_calibration([str(ar), "--gpu", "h100-sxm", "--workers", "4"]) == 0
    assert main_calibration([str(path), "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce, 4 GPUs: latency 10.0 us, bus bandwidth 300.0 GB/s = 0.667" in out
    assert "h100-sxm tp=1: compute_efficiency" in out
    path.write_text("n_head,num_tokens\n4,1\n")
    with pytest.raises(ScenarioError, match=r"mlp\.csv: n_kv_head: missing column"):
        gemm_efficiencies(path, "h100-sxm")


def test_efficiencies_from_an_llmservingsim_dense_profile(tmp_path, capsys):
    rows = ["layer,tokens,time_us"]
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn"):
        rows += [f"{op},1,100", f"{op},2048,1000"]
    path = tmp_path / "dense.csv"
    path.write_text("\n".join(rows) + "\n")
    e = dense_profile_efficiencies(path, "meta-llama/Llama-2-7b-hf", "a100-80gb")
    weights = 4096 * 96 * 128 + 4096 * 4096 + 2 * 4096 * 11008 + 11008 * 4096
    assert weights == 202_375_168
    assert e.bandwidth_efficiency == pytest.approx(weights * 2 / 400e-6 / 2039e9, rel=1e-12)
    assert e.compute_efficiency == pytest.approx(2 * 2048 * weights / 4e-3 / 312e12, rel=1e-12)
    assert main_calibration([str(path), "--gpu", "a100-80gb", "--model", "llama-2-7b"]) == 0
    assert "compute_efficiency 0.664" in capsys.readouterr().out
    assert main_calibration([str(path), "--gpu", "a100-80gb"]) == 2
    assert capsys.readouterr().err.strip() == "orcasim: error: a dense.csv profile needs --model"

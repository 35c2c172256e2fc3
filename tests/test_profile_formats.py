"""The ``profile`` model's other inputs: MoE blocks, CUDA-graph padding, Vidur's profiles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT

import orcasim
from orcasim.errors import ScenarioError
from orcasim.latency.profile_moe import experts_touched
from orcasim.registry import latency_models
from orcasim.replay.scenario import default_capture_sizes
from orcasim.spec import build_spec

REAL = ROOT.parent / "shared" / "realdata" / "profiles" / "RTXPRO6000"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="shared/realdata not present")


def model(directory: Path | str, **extra):
    spec = {"type": "profile", "dir": str(directory), **extra}
    return build_spec(latency_models, spec, "engine.latency").create()


def write_moe_profile(root: Path, meta: str = "model: toy-moe\nnum_layers: 2\n") -> Path:
    """Two layers; constant qkv (10 us), attention (5 us) and lm_head (100 us); a moe.csv."""
    tp1 = root / "tp1"
    tp1.mkdir(parents=True)
    (root / "meta.yaml").write_text(meta)
    (tp1 / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,10\nqkv_proj,101,10\n")
    (tp1 / "per_sequence.csv").write_text("layer,sequences,time_us\nlm_head,1,100\n")
    (tp1 / "attention.csv").write_text(
        "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,0,5\n")
    # 4 experts, 2 per token: one token touches exactly 2, so tokens=1 has one row
    (tp1 / "moe.csv").write_text("tokens,activated_experts,time_us\n"
                                 "1,2,100\n2,2,110\n2,4,200\n4,2,120\n4,4,220\n")
    return root


def test_experts_touched_by_uniform_and_balanced_routing():
    # E (1 - (1 - k/E)^N) with E=4, k=2: 2, 3, 3.5, 3.75
    assert [experts_touched(n, 4, 2, "uniform") for n in (1, 2, 3, 4)] == [2, 3, 3.5, 3.75]
    assert [experts_touched(n, 4, 2, "balanced") for n in (1, 2, 3)] == [2, 4, 4]
    assert experts_touched(0, 4, 2, "uniform") == 0


def test_moe_block_against_the_steps_tokens(tmp_path):
    m = model(write_moe_profile(tmp_path / "p"), num_experts=4, experts_per_token=2)
    # 2 tokens touch 3 experts: halfway between the 2-expert row at 2 tokens (110)
    # and the 4-expert row at 2 tokens (200)
    assert m.moe(2.0) == pytest.approx(155e-6, rel=1e-12)
    # 3 tokens touch 3.5: the 2-expert row at 3 tokens is 115, the 4-expert row 210
    assert m.moe(3.0) == pytest.approx((115 + 0.75 * (210 - 115)) * 1e-6, rel=1e-12)
    assert m.moe(1.0) == pytest.approx(100e-6, rel=1e-12)
    # a decode step of 2 sequences: 2 layers x (qkv 10 + attention 5 + moe 155) + lm_head 100
    assert m.step_time(orcasim.StepPlan(2, 0)) == pytest.approx(
        (2 * (10 + 5 + 155) + 100) * 1e-6, rel=1e-12)
    balanced = model(tmp_path / "p", num_experts=4, experts_per_token=2, moe_routing="balanced")
    assert balanced.moe(2.0) == pytest.approx(200e-6, rel=1e-12)


def test_moe_counts_come_from_meta_or_are_required(tmp_path):
    directory = write_moe_profile(tmp_path / "p")
    with pytest.raises(ScenarioError, match="num_experts") as err:
        model(directory)
    assert "moe.csv" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ScenarioError, match="experts_per_token"):
        model(directory, num_experts=2, experts_per_token=3)
    # (profiles are read once per directory: a second one with the counts in meta.yaml)
    counted = write_moe_profile(tmp_path / "q", "num_layers: 2\nnum_experts: 4\n"
                                "experts_per_token: 2\n")
    assert model(counted).moe(2.0) == pytest.approx(155e-6, rel=1e-12)


def test_moe_at_tp2_borrows_tp1_divided_by_tp(tmp_path):
    directory = write_moe_profile(tmp_path / "p")
    shutil.copytree(directory / "tp1", directory / "tp2")
    (directory / "tp2" / "moe.csv").unlink()
    m = model(directory, tp=2, num_experts=4, experts_per_token=2, hidden_size=8,
              allreduce_bandwidth=1e9)
    assert m.moe(2.0) == pytest.approx(155e-6 / 2, rel=1e-12)
    own = write_moe_profile(tmp_path / "q")
    shutil.copytree(own / "tp1", own / "tp2")
    (own / "tp2" / "moe.csv").write_text("tokens,activated_experts,time_us\n1,2,7\n")
    m = model(own, tp=2, num_experts=4, experts_per_token=2, hidden_size=8,
              allreduce_bandwidth=1e9)
    assert m.moe(2.0) == pytest.approx(7e-6, rel=1e-12)  # its own table, as measured


def test_bad_moe_file_is_one_line(tmp_path):
    directory = write_moe_profile(tmp_path / "p")
    path = directory / "tp1" / "moe.csv"
    path.write_text("tokens,experts,time_us\n1,2,100\n")
    with pytest.raises(ScenarioError) as err:
        model(directory, num_experts=4, experts_per_token=2)
    assert "activated_experts" in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


@needs_real
def test_real_qwen3_moe_profile_gives_plausible_steps():
    """Qwen3-30B-A3B: 128 experts, 8 per token, 48 layers, on an RTX PRO 6000 (1.8 TB/s)."""
    directory = REAL / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
    m = model(directory, num_layers=48, num_experts=128, experts_per_token=8)
    one = m.step_time(orcasim.StepPlan(1, 500))
    full = m.step_time(orcasim.StepPlan(128, 128 * 500))
    prefill = m.step_time(orcasim.StepPlan(1, 0, 2048, 0))
    # one decode reads ~3.3 B active parameters (6.6 GB: 3.7 ms at 1.8 TB/s); 128 decodes
    # touch every expert (61 GB: 34 ms); a 2048-token prefill also computes 13.5 TFLOP
    assert 3.7e-3 < one < 8e-3
    assert 34e-3 < full < 70e-3
    assert full < prefill < 150e-3
    # more tokens never take less time; the MoE block is most of a decode step's growth
    steps = [m.step_time(orcasim.StepPlan(n, n * 500)) for n in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert steps == sorted(steps)
    assert m.moe(128.0) > 10 * m.moe(1.0)
    tp2 = model(directory, tp=2, num_layers=48, num_experts=128, experts_per_token=8,
                hidden_size=2048, allreduce_bandwidth=16e9)
    assert tp2.moe(64.0) == pytest.approx(m.moe(64.0) / 2, rel=1e-12)


@needs_real
def test_real_qwen3_32b_tp2_profile_loads():
    """Qwen3-32B (head_dim 128) at TP2: one GPU's half of each operator plus the all-reduces."""
    directory = REAL / "Qwen" / "Qwen3-32B" / "bf16"
    tp1 = model(directory, num_layers=64)
    tp2 = model(directory, tp=2, num_layers=64, hidden_size=5120, allreduce_bandwidth=16e9)
    assert tp2.moe is None
    plan = orcasim.StepPlan(8, 8 * 1000)
    # 32B parameters: ~65 GB per decode step at tp1 (36 ms at 1.8 TB/s), about half at tp2
    assert 36e-3 < tp1.step_time(plan) < 70e-3
    assert 0.45 < tp2.step_time(plan) / tp1.step_time(plan) < 0.7


def write_dense_profile(root: Path) -> Path:
    tp1 = root / "tp1"
    tp1.mkdir(parents=True)
    (root / "meta.yaml").write_text("num_layers: 2\n")
    # mlp: 10 us at 1 token, +2 us per token; lm_head 100 us at 1 sequence, +10 per sequence
    (tp1 / "dense.csv").write_text("layer,tokens,time_us\nmlp,1,10\nmlp,101,210\n")
    (tp1 / "per_sequence.csv").write_text(
        "layer,sequences,time_us\nlm_head,1,100\nlm_head,11,200\n")
    (tp1 / "attention.csv").write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
                                       "0,0,1,0,5\n0,0,11,0,15\n")
    return root


def test_cuda_graph_padding_of_the_dense_operators(tmp_path):
    m = model(write_dense_profile(tmp_path / "p"), cudagraph_capture_sizes=[8, 1, 2, 4])
    assert [m.padded_tokens(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 9]
    # 3 decodes: mlp at 4 tokens (16 us), attention (7 us) and lm_head (120 us) at 3
    assert m.step_time(orcasim.StepPlan(3, 0)) == pytest.approx(
        (2 * (16 + 7) + 120) * 1e-6, rel=1e-12)
    # 9 tokens: past the largest graph, run as is (mlp 26 us)
    assert m.step_time(orcasim.StepPlan(9, 0)) == pytest.approx(
        (2 * (26 + 13) + 180) * 1e-6, rel=1e-12)
    eager = model(tmp_path / "p")
    assert eager.step_time(orcasim.StepPlan(3, 0)) == pytest.approx(
        (2 * (14 + 7) + 120) * 1e-6, rel=1e-12)
    with pytest.raises(ScenarioError, match="cudagraph_capture_sizes"):
        model(tmp_path / "p", cudagraph_capture_sizes=[0, 4])


def test_vllm_default_capture_sizes():
    sizes = default_capture_sizes(128, 2048)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [240, 248, 256]
    assert len(sizes) == 35
    big = default_capture_sizes(256, 8192)  # capped at 512: 51 sizes
    assert len(big) == 51 and big[-3:] == [480, 496, 512]
    assert default_capture_sizes(8, 2048) == [1, 2, 4, 8, 16]
    assert default_capture_sizes(128, 100)[-1] == 96  # no graph larger than a step


#: Vidur's column layout (a subset of its statistics; the reader uses the medians)
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
SHAPE = "n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp"


def write_vidur(root: Path) -> Path:
    """mlp.csv and attention.csv in Vidur's layout (times in ms), rows for tp 1 and tp 2."""
    root.mkdir(parents=True)
    stats = ",".join(f"time_stats.{op}.mean,time_stats.{op}.median" for op in OPS)
    lines = [f"{stats},{SHAPE},num_tokens,num_tensor_parallel_workers"]
    for tp in (1, 2):
        for tokens in (1, 101):
            # every operator: 0.001 ms + 0.0001 ms per token at tp 1, twice that at tp 2
            t = tp * (0.001 + 0.0001 * (tokens - 1))
            cells = ",".join(f"{t * 1.1},{t}" for _ in OPS)
            lines.append(f"{cells},8,8,64,128,100,True,{tokens},{tp}")
    (root / "mlp.csv").write_text("\n".join(lines) + "\n")
    head = ("time_stats.attn_prefill.median,time_stats.attn_decode.median,"
            "time_stats.attn_kv_cache_save.median,n_embd,n_q_head,n_kv_head,block_size,"
            "num_tensor_parallel_workers,max_model_len,batch_size,prefill_chunk_size,"
            "kv_cache_size,is_prefill,attention_backend")
    rows = [head]
    for pc in (16, 116):  # prefill: 0.01 ms + 0.0001 per chunk token + 0.00001 per cached
        for kv in (0, 1000):
            rows.append(f"{0.01 + 0.0001 * (pc - 16) + 0.00001 * kv},,0.002,64,8,8,16,1,4096,"
                        f"1,{pc},{kv},True,FLASHINFER")
    for bs in (1, 11):  # decode: 0.005 ms + 0.001 per request + 0.000001 per context token
        for kv in (100, 1100):
            rows.append(f",{0.005 + 0.001 * (bs - 1) + 0.000001 * (kv - 100)},,64,8,8,16,1,"
                        f"4096,{bs},0,{kv},False,FLASHINFER")
    rows.append("9,,9,64,8,8,16,2,4096,1,16,0,True,FLASHINFER")  # tp 2: not read at tp 1
    rows.append(",9,9,64,8,8,16,2,4096,1,0,100,False,FLASHINFER")
    (root / "attention.csv").write_text("\n".join(rows) + "\n")
    return root


def test_vidur_profiles_compose_a_step(tmp_path):
    directory = write_vidur(tmp_path / "vidur")
    m = model(directory, num_layers=2)  # auto-detected
    assert m.vidur is not None and m.per_seq == []
    # 2 decodes at contexts 300 and 500 (mean 400) plus a 66-token chunk over 500 cached
    plan = orcasim.StepPlan(3, 1366, 66, 2, [
        (_Req(500), 66), (_Req(300), 1), (_Req(500), 1)], contexts=[500, 300, 500])
    tokens = 68
    op_ms = 0.001 + 0.0001 * (tokens - 1)  # each of the ten operators
    prefill_ms = 0.01 + 0.0001 * 50 + 0.00001 * 500
    decode_ms = 0.005 + 0.001 * 1 + 0.000001 * 300
    kv_save_ms = 0.002  # constant in the file
    layer_ms = 9 * op_ms + prefill_ms + decode_ms + kv_save_ms  # emb runs once per step
    assert m.attention_time(plan) == pytest.approx(
        (prefill_ms + decode_ms + kv_save_ms) * 1e-3, rel=1e-12)
    assert m.step_time(plan) == pytest.approx((2 * layer_ms + op_ms) * 1e-3, rel=1e-12)
    tp2 = model(directory, format="vidur", num_layers=2, tp=2, hidden_size=64,
                allreduce_bandwidth=1e9)
    assert tp2.per_step[0](1.0) == pytest.approx(2 * 0.001e-3, rel=1e-12)


def test_vidur_errors_name_the_file_and_column(tmp_path):
    directory = write_vidur(tmp_path / "vidur")
    with pytest.raises(ScenarioError, match="num_layers"):
        model(directory)
    with pytest.raises(ScenarioError, match="tensor-parallel degree 4") as err:
        model(directory, num_layers=2, tp=4, hidden_size=64, allreduce_bandwidth=1e9,
              format="vidur")
    assert "mlp.csv" in str(err.value)
    path = directory / "mlp.csv"
    path.write_text(path.read_text().replace("time_stats.mlp_act.median", "mlp_act_ms"))
    with pytest.raises(ScenarioError) as err:
        model(directory, num_layers=2)
    assert "time_stats.mlp_act.median" in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


class _Req:
    def __init__(self, computed: int) -> None:
        self.num_computed_tokens = computed


@needs_real
def test_replay_scenario_of_a_moe_run_builds_the_profile_model(tmp_path):
    """The scenario a replay writes for an MoE run (no measured run is replayed here)."""
    from orcasim.replay.scenario import build_scenario

    profiles = REAL / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
    meta = {"model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "vllm_version": "0.19.0",
            "engine_kwargs": {"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                              "tensor_parallel_size": 2, "num_gpu_blocks_override": 1000}}
    sc = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=profiles)
    latency = sc["engine"]["latency"]
    assert (latency["num_experts"], latency["experts_per_token"], latency["num_layers"]) == \
        (128, 8, 48)
    assert latency["cudagraph_capture_sizes"] == default_capture_sizes(64, 2048)
    m = build_spec(latency_models, latency, "engine.latency").create()
    assert m.moe is not None and m.padded_tokens(3) == 4
    meta["engine_kwargs"]["enforce_eager"] = True
    eager = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=profiles)
    assert "cudagraph_capture_sizes" not in eager["engine"]["latency"]


def doc_block(marker: str) -> dict:
    """The first fenced block after ``marker`` in docs/latency.md, as YAML."""
    import re

    import yaml

    text = (ROOT / "docs" / "latency.md").read_text().split(marker, 1)[1]
    return yaml.safe_load(re.search(r"```\n(.*?)```", text, re.S).group(1))


def build(spec: dict):
    return build_spec(latency_models, spec, "engine.latency").create()


def test_the_latency_page_moe_and_vidur_examples_run(tmp_path):
    moe = doc_block("**Mixture of experts.**")["engine"]["latency"]
    assert moe["dir"].endswith("Qwen3-30B-A3B-Instruct-2507/bf16")
    directory = write_moe_profile(tmp_path / "moe")
    m = build({**moe, "dir": str(directory), "num_experts": 4, "experts_per_token": 2})
    assert m.step_time(orcasim.StepPlan(8, 8 * 512)) > 0
    if REAL.is_dir():
        real = build({**moe, "dir": str(REAL / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16")})
        assert real.moe is not None
    vidur = doc_block("**Vidur's profiles.**")["engine"]["latency"]
    assert vidur["format"] == "vidur"
    m = build({**vidur, "dir": str(write_vidur(tmp_path / "vidur"))})
    assert m.step_time(orcasim.StepPlan(8, 8 * 512)) > 0


def test_a_name_too_long_for_the_file_system_is_an_unknown_profile_or_model():
    from orcasim.model_specs import resolve_model

    with pytest.raises(ScenarioError, match="profile directory not found"):
        model("y" * 400)
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model("x" * 400)


def write_ep_profile(root: Path) -> Path:
    """The toy MoE profile (4 experts, 2 per token) with rows at 1 and 2 activated experts."""
    directory = write_moe_profile(root)
    (directory / "tp1" / "moe.csv").write_text("tokens,activated_experts,time_us\n"
                                               "1,1,50\n1,2,100\n2,1,60\n2,2,110\n")
    return directory


def test_experts_touched_on_one_gpu_of_an_expert_parallel_group():
    # E=4, k=2 over ep=2 GPUs: 2 local experts; N tokens per engine, 2N tokens in all, each
    # missing a given expert with probability 1/2: 2 (1 - (1/2)^(2N)) = 1.5, 1.875
    assert [experts_touched(n, 4, 2, "uniform", ep=2) for n in (1, 2)] == [1.5, 1.875]
    assert [experts_touched(n, 4, 2, "balanced", ep=2) for n in (0.5, 1, 2)] == [1, 2, 2]
    assert experts_touched(2, 4, 2, "uniform", ep=1) == 3.0


def test_expert_parallel_moe_block_and_token_gathers(tmp_path):
    m = model(write_ep_profile(tmp_path / "p"), num_experts=4, experts_per_token=2,
              expert_parallel=2, hidden_size=8, allreduce_bandwidth=1e9,
              allreduce_latency=1e-6)
    # 1 token per engine touches 1.5 local experts: halfway between 50 and 100 us
    assert m.moe(1.0) == pytest.approx(75e-6, rel=1e-12)
    # 2 tokens: 1.875 experts at 2 tokens, 60 + 0.875 x (110 - 60)
    assert m.moe(2.0) == pytest.approx(103.75e-6, rel=1e-12)
    # a decode step of 2 sequences: 2 layers x (qkv 10 + attention 5 + moe 103.75) + lm_head
    # 100, plus 2 gathers per layer (all-gather, reduce-scatter) of 1 us and
    # (ep - 1) x 2 tokens x 8 x 2 bytes at 1 GB/s (32 ns)
    assert m.step_time(orcasim.StepPlan(2, 0)) == pytest.approx(
        (2 * (10 + 5 + 103.75) + 100) * 1e-6 + 4 * (1e-6 + 32e-9), rel=1e-12)


@pytest.mark.parametrize("extra, message", [
    ({"expert_parallel": 3}, "does not divide num_experts"),
    ({"expert_parallel": 2}, "needs hidden_size and allreduce_bandwidth"),
    ({"expert_parallel": 2, "tp": 2, "hidden_size": 8, "allreduce_bandwidth": 1e9},
     "TP1 engines only"),
])
def test_expert_parallel_mistakes_are_one_line(tmp_path, extra, message):
    directory = write_ep_profile(tmp_path / "p")
    shutil.copytree(directory / "tp1", directory / "tp2")
    with pytest.raises(ScenarioError, match=message) as err:
        model(directory, num_experts=4, experts_per_token=2, **extra)
    assert "\n" not in str(err.value)


def test_expert_parallel_needs_a_moe_profile(tmp_path):
    from test_profile_latency import write_profile

    with pytest.raises(ScenarioError, match="mixture-of-experts profile"):
        model(write_profile(tmp_path / "dense"), expert_parallel=2, hidden_size=8,
              allreduce_bandwidth=1e9)

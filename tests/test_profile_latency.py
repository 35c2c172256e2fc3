"""The ``profile`` latency model: hand-computed steps, the shipped profile, bad files."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT

import orcasim
from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.latency.profile import build_nested, eval_nested
from orcasim.registry import latency_models
from orcasim.spec import build_spec

SHIPPED = ROOT.parent / "shared" / "realdata" / "profiles" / "RTXPRO6000" / "meta-llama" / \
    "Llama-3.1-8B" / "bf16"
needs_shipped = pytest.mark.skipif(not SHIPPED.is_dir(), reason="shared/realdata not present")


def attention_us(pc: float, kp: float, nd: float, kd: float) -> float:
    """The synthetic attention time: multilinear, so interpolation reproduces it exactly."""
    return 5 + 0.1 * pc + 0.0001 * pc * kp + 0.5 * nd + 0.001 * nd * kd


def write_profile(root: Path) -> Path:
    """A two-layer profile with two grid points per axis (times in microseconds)."""
    tp1 = root / "tp1"
    tp1.mkdir(parents=True)
    (root / "meta.yaml").write_text("model: toy\nnum_layers: 2\n")
    # mlp: 10 us at 1 token, +2 us per token; embedding: 1 us, once per step
    (tp1 / "dense.csv").write_text(
        "layer,tokens,time_us\nmlp,1,10\nmlp,101,210\nembedding,1,1\nembedding,101,1\n")
    # lm_head: 100 us at 1 sequence, +10 us per sequence
    (tp1 / "per_sequence.csv").write_text(
        "layer,sequences,time_us\nlm_head,1,100\nlm_head,11,200\n")
    rows = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for pc in (0, 100):
        for kp in (0, 1000):
            for nd in (0, 10):
                for kd in (0, 1000):
                    rows.append(f"{pc},{kp},{nd},{kd},{attention_us(pc, kp, nd, kd)}")
    (tp1 / "attention.csv").write_text("\n".join(rows) + "\n")
    return root


def model(directory: Path | str, **extra):
    spec = {"type": "profile", "dir": str(directory), **extra}
    return build_spec(latency_models, spec, "engine.latency").create()


def req(computed: int, total: int, outputs: int) -> SimpleNamespace:
    return SimpleNamespace(num_computed_tokens=computed, num_tokens=total,
                           num_output_tokens=outputs)


def test_decode_only_plan(tmp_path):
    m = model(write_profile(tmp_path / "p"))
    # 4 decodes of 500 context, 4 tokens: mlp 16, attention 9, embedding 1, lm_head 130 (us)
    assert attention_us(0, 0, 4, 500) == 9
    assert m.step_time(orcasim.StepPlan(4, 2000)) == pytest.approx(
        (2 * (16 + 9) + 1 + 130) * 1e-6, rel=1e-12)


def test_mixed_plan_from_scheduled_pairs(tmp_path):
    m = model(write_profile(tmp_path / "p"), overhead_s=0.001)
    scheduled = [(req(200, 300, 0), 50), (req(0, 30, 0), 30),
                 (req(400, 401, 3), 1), (req(600, 601, 5), 1)]
    plan = orcasim.StepPlan(4, 1200, 80, 2, scheduled)
    # one chunk of 80 tokens keeping the query-key pairs of both:
    # 50 * (200 + 25) + 30 * (0 + 15) = 11700 = 80 * (K + 40), K = 106.25 (the
    # token-weighted mean 125 would count 50 * 30 pairs across the two requests)
    assert m.attention_inputs(plan) == (80.0, 106.25, 2.0, 500.0)
    att = attention_us(80, 106.25, 2, 500)
    assert att == pytest.approx(15.85)
    mlp = 10 + 2 * 81
    assert m.step_time(plan) == pytest.approx((2 * (mlp + att) + 1 + 130) * 1e-6 + 0.001,
                                              rel=1e-12)


def test_between_grid_points_and_beyond(tmp_path):
    directory = write_profile(tmp_path / "p")
    m = model(directory)
    # prefill only, no decodes: 30 tokens, between the token and the chunk grid points
    plan = orcasim.StepPlan(1, 0, 30, 0)
    assert m.step_time(plan) == pytest.approx(
        (2 * (10 + 2 * 29 + attention_us(30, 0, 0, 0)) + 1 + 100) * 1e-6, rel=1e-12)
    # 201 tokens: past the dense grid (101) and the chunk grid (100)
    big = orcasim.StepPlan(1, 0, 201, 0)
    linear = (2 * (10 + 2 * 200 + attention_us(201, 0, 0, 0)) + 1 + 100) * 1e-6
    clamped = (2 * (210 + attention_us(100, 0, 0, 0)) + 1 + 100) * 1e-6
    assert m.step_time(big) == pytest.approx(linear, rel=1e-12)
    assert model(directory, extrapolate="clamp").step_time(big) == pytest.approx(clamped,
                                                                                  rel=1e-12)



def test_several_chunks_below_zero_context_use_the_slope_over_the_same_span(tmp_path):
    """Two fresh 400-token chunks: one 800-token chunk at context -200 (same query-key pairs).

    The table's context point 16 sits 3 us above the line through 0 and 1000.
    Extending the 0-16 segment down to -200 would subtract 53.5 us (the bump
    magnified 12.5 times); the model extends along [0, 200] instead:
    T(-200) = 2 T(0) - T(200).
    """
    d = tmp_path / "p"
    write_profile(d)
    rows = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for pc in (0, 1000):
        for kp in (0, 16, 1000):
            for nd in (0, 10):
                for kd in (0, 1000):
                    bump = 3.0 if kp == 16 else 0.0
                    rows.append(f"{pc},{kp},{nd},{kd},{attention_us(pc, kp, nd, kd) + bump}")
    (d / "tp1" / "attention.csv").write_text("\n".join(rows) + "\n")
    m = model(d)
    plan = orcasim.StepPlan(2, 0, 800, 0, [(req(0, 400, 0), 400), (req(0, 400, 0), 400)])
    assert m.attention_inputs(plan) == (800.0, -200.0, 0.0, 0.0)
    t0 = attention_us(800, 0, 0, 0)  # 85 us
    # at context 200: between the grid points 16 (+3 us) and 1000, 184/984 of the way
    t16, t1000 = attention_us(800, 16, 0, 0) + 3, attention_us(800, 1000, 0, 0)
    t200 = t16 + 184 / 984 * (t1000 - t16)
    assert m.attention_time(plan) == pytest.approx((2 * t0 - t200) * 1e-6, rel=1e-12)
    # 66.56 us, against 69 us on the line without the bump (31.5 us from the 0-16 segment)
    assert m.attention_time(plan) * 1e6 == pytest.approx(66.56, abs=0.01)
    # clamp holds the table's edge value instead
    assert model(d, extrapolate="clamp").attention_time(plan) == pytest.approx(t0 * 1e-6)


def test_irregular_attention_grid_interpolates_axis_by_axis():
    import numpy as np

    # chunk 0 has only context 0; chunk 100 has contexts 0 and 1000
    keys = np.array([[0, 0], [100, 0], [100, 1000]], dtype=float)
    tree = build_nested(keys, np.array([1.0, 11.0, 21.0]))
    # chunk 50, context 500: halfway between 1 (chunk 0) and 16 (chunk 100 at context 500)
    assert eval_nested(tree, (50.0, 500.0), clamp=False) == pytest.approx(8.5)


def test_num_layers_is_required_without_meta(tmp_path):
    directory = write_profile(tmp_path / "p")
    (directory / "meta.yaml").write_text("model: toy\n")
    with pytest.raises(ScenarioError, match="num_layers"):
        model(directory)
    assert model(directory, num_layers=3).num_layers == 3


@pytest.mark.parametrize(("file", "edit", "column"), [
    ("dense.csv", lambda t: t.replace("time_us", "t_us"), "time_us"),
    ("per_sequence.csv", None, "sequences"),
    ("attention.csv", lambda t: t.replace("\n0,0,0,1000,", "\n0,0,0,x,", 1), "kv_decode"),
])
def test_bad_profile_files_name_the_file_and_column(tmp_path, file, edit, column):
    directory = write_profile(tmp_path / "p")
    path = directory / "tp1" / file
    if edit is None:
        path.unlink()
    else:
        path.write_text(edit(path.read_text()))
    with pytest.raises(ScenarioError) as err:
        model(directory)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and column in message


def test_bad_profile_exits_with_status_2(tmp_path, capsys):
    directory = write_profile(tmp_path / "p")
    (directory / "tp1" / "dense.csv").write_text("layer,tokens\nmlp,1\n")
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump({
        "workload": {"type": "list", "requests": [
            {"name": "a", "arrival": 0, "prompt_len": 4, "output_len": 2}]},
        "policy": {"type": "vllm-v1"},
        "engine": {"latency": {"type": "profile", "dir": str(directory)}}}))
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    assert "dense.csv" in capsys.readouterr().err


def test_end_to_end_with_vllm_v1(tmp_path):
    directory = write_profile(tmp_path / "p")
    requests = [{"name": f"r{i}", "arrival": 0.001 * i, "prompt_len": 40 + 10 * i,
                 "output_len": 5 + i} for i in range(6)]
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "policy": {"type": "vllm-v1", "max_num_batched_tokens": 64, "max_num_seqs": 4,
                   "block_size": 16},
        "engine": {"latency": {"type": "profile", "dir": str(directory)}}})
    summary = next(iter(orcasim.simulate(sc).summary.values()))
    assert summary["num_finished"] == 6


@needs_shipped
def test_shipped_rtx_pro_6000_llama_profile():
    m = model(SHIPPED, num_layers=32)
    prefill = [m.step_time(orcasim.StepPlan(1, 0, n, 0)) for n in (16, 128, 512, 1024, 2048)]
    decode = [m.step_time(orcasim.StepPlan(b, b * 1000)) for b in (1, 8, 32, 128)]
    for times in (prefill, decode):
        assert all(t > 0 for t in times)
        assert all(a < b for a, b in pairwise(times))
    t32 = m.step_time(orcasim.StepPlan(32, 32 * 1000))
    print(f"RTX PRO 6000, Llama-3.1-8B: decode step, batch 32 x 1000 context: {t32 * 1e3:.2f} ms")
    assert 0.003 < t32 < 0.1


def test_the_built_in_profile_is_found_by_name_and_equals_the_shared_copy():
    from orcasim.latency.profile import BUILTIN_PROFILES, find_profile

    path = find_profile("rtx-pro-6000/llama-3.1-8b/bf16")
    assert path == (BUILTIN_PROFILES / "rtx-pro-6000/llama-3.1-8b/bf16").resolve()
    spec = {"type": "profile", "dir": "rtx-pro-6000/llama-3.1-8b/bf16", "num_layers": 32}
    sc = orcasim.Scenario({"workload": {"type": "list", "requests": [
        {"prompt_len": 100, "output_len": 3}]}, "policy": "fcfs", "engine": {"latency": spec}})
    model = sc.variants[0].latency.create()
    t = model.step_time(orcasim.StepPlan(32, 32 * 1000))
    assert 0.003 < t < 0.1
    if SHIPPED.is_dir():
        for name in ("dense.csv", "attention.csv", "per_sequence.csv"):
            assert (path / "tp1" / name).read_bytes() == (SHIPPED / "tp1" / name).read_bytes()
    with pytest.raises(orcasim.ScenarioError, match=r"built-in: rtx-pro-6000/llama-3\.1-8b/bf16"):
        find_profile("no/such/profile")


def test_vllm_v1_steps_use_each_request_context(tmp_path):
    # vllm-v1 advances num_computed_tokens when it schedules; the model reads the contexts the
    # plan carries. One request, prompt 40, 3 tokens: a 40-token prefill, then decodes at 40, 41.
    m = model(write_profile(tmp_path / "p"))
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [{"prompt_len": 40, "output_len": 3}]},
        "policy": {"type": "vllm-v1", "max_num_batched_tokens": 64, "max_num_seqs": 4},
        "engine": {"latency": {"type": "profile", "dir": str(tmp_path / "p")}}})
    only = next(iter(orcasim.simulate(sc).variants.values())).requests.iloc[0]
    prefill = 2 * ((10 + 2 * 39) + attention_us(40, 0, 0, 0)) + 1 + 100  # 295 us
    decode = [2 * (10 + attention_us(0, 0, 1, c)) + 1 + 100 for c in (40, 41)]
    assert prefill == 295
    assert only.ttft == pytest.approx(prefill * 1e-6, rel=1e-12)
    assert only.e2e == pytest.approx((prefill + sum(decode)) * 1e-6, rel=1e-12)
    # the same plan with the requests' counters already advanced: contexts win
    plan = orcasim.StepPlan(2, 900, 0, 2, [(req(101, 101, 2), 1), (req(901, 901, 5), 1)],
                            [100, 900])
    assert m.attention_inputs(plan) == (0.0, 0.0, 2.0, 500.0)


SKEW_META = """model: toy
num_layers: 2
skew_fit:
  enabled: true
  bucket_axes:
    n_bins: [0, 2, 4, 1000000]
    n_labels: [n<=2, n<=4, n>4]
    skew_rate_bins: [-0.01, 0.4, 0.7, 1.01]
    skew_rate_labels: [sr<=40%, sr<=70%, sr>70%]
    kv_big_bins: [0, 1024, 1000000000]
    kv_big_labels: [kvB<=1k, kvB>1k]
    kp_bins: [-1, 0, 1000000000]
    kp_labels: [kp=0, kp>0]
  per_tp:
    1: {alpha_default: 0.5, bucket_table: tp1/skew_fit.csv}
"""


def skewed_profile(root: Path) -> Path:
    directory = write_profile(root)
    (directory / "meta.yaml").write_text(SKEW_META)
    (directory / "tp1" / "skew_fit.csv").write_text(
        "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
        "0,n<=2,sr<=70%,kvB<=1k,kp=0,0.25,4\n")
    return directory


def test_skew_correction_blends_toward_the_longest_context(tmp_path):
    m = model(skewed_profile(tmp_path / "p"))
    # two decodes at 100 and 900: mean 500, skew rate (500-100)/800 = 0.5, longest 900
    plan = orcasim.StepPlan(2, 1000, 0, 2, [(req(100, 101, 1), 1), (req(900, 901, 1), 1)],
                            [100, 900])
    t_mean, t_max = attention_us(0, 0, 2, 500), attention_us(0, 0, 2, 900)
    assert (t_mean, t_max) == (7.0, pytest.approx(7.8))
    att = t_mean + 0.25 * (t_max - t_mean)  # the bucket's alpha
    assert m.step_time(plan) == pytest.approx((2 * (12 + att) + 1 + 110) * 1e-6, rel=1e-12)
    # longest context past 1k: no fitted bucket, the pooled alpha_default (0.5)
    wide = orcasim.StepPlan(2, 1300, 0, 2, [(req(100, 101, 1), 1), (req(1200, 1201, 1), 1)],
                            [100, 1200])
    t_mean, t_max = attention_us(0, 0, 2, 650), attention_us(0, 0, 2, 1200)
    assert m.step_time(wide) == pytest.approx(
        (2 * (12 + t_mean + 0.5 * (t_max - t_mean)) + 1 + 110) * 1e-6, rel=1e-12)
    # switched off, or equal contexts: the uniform batch at the mean
    off = model(tmp_path / "p", skew_correction=False)
    assert off.step_time(plan) == pytest.approx((2 * (12 + 7) + 1 + 110) * 1e-6, rel=1e-12)
    even = orcasim.StepPlan(2, 1000, 0, 2, [(req(500, 501, 1), 1), (req(500, 501, 1), 1)],
                            [500, 500])
    assert m.step_time(even) == off.step_time(even)


def test_skew_fit_missing_column_is_one_line(tmp_path):
    directory = skewed_profile(tmp_path / "p")
    path = directory / "tp1" / "skew_fit.csv"
    path.write_text(path.read_text().replace("alpha,", "a,", 1))
    with pytest.raises(ScenarioError) as err:
        model(directory)
    assert "alpha" in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_operators_that_run_twice_per_layer(tmp_path):
    directory = write_profile(tmp_path / "p")
    dense = directory / "tp1" / "dense.csv"
    dense.write_text(dense.read_text() + "layernorm,1,3\nlayernorm,101,3\n")
    plan = orcasim.StepPlan(1, 0, 1, 0)
    once = model(directory, op_counts={})
    twice = model(directory)  # default: layernorm twice per layer
    assert twice.step_time(plan) - once.step_time(plan) == pytest.approx(2 * 3e-6, rel=1e-9)


def test_tensor_parallel_steps_add_two_all_reduces_per_layer(tmp_path):
    import shutil

    directory = write_profile(tmp_path / "p")
    shutil.copytree(directory / "tp1", directory / "tp2")  # one GPU's share, as profiled
    with pytest.raises(ScenarioError, match="hidden_size and allreduce_bandwidth"):
        model(directory, tp=2)
    tp1 = model(directory)
    tp2 = model(directory, tp=2, hidden_size=1000, allreduce_bandwidth=1e9,
                allreduce_latency=1e-5)
    plan = orcasim.StepPlan(4, 2000)
    # 2 layers x 2 all-reduces; a ring over 2 GPUs moves 2 (2 - 1) / 2 = 1 x 4 tokens x 2000 B
    comm = 4 * (1e-5 + 4 * 1000 * 2 / 1e9)
    assert tp2.step_time(plan) - tp1.step_time(plan) == pytest.approx(comm, rel=1e-9)


@pytest.mark.parametrize(("cell", "shown"), [("x", "'x'"), ("", "''"), (" -1 ", "'-1'"),
                                             ("inf", "'inf'"), ("nan", "'nan'")])
def test_a_bad_cell_is_named_by_its_line(tmp_path, cell, shown):
    from orcasim.latency.profile_tables import read_table

    path = tmp_path / "t.csv"
    path.write_text(f"layer,tokens,time_us\nmlp,1,2.5\nmlp,2,{cell}\nmlp,4,7\n")
    with pytest.raises(ScenarioError) as err:
        read_table(path, ("layer",), ("tokens", "time_us"))
    assert str(err.value) == f"{path}: time_us: line 3: {shown} is not a number >= 0"
    path.write_text("layer,tokens,time_us\nmlp,1, 2.5\nmlp,2,1e3\n")
    t = read_table(path, ("layer",), ("tokens", "time_us"))
    assert t["time_us"].tolist() == [2.5, 1000.0] and t["layer"].tolist() == ["mlp", "mlp"]

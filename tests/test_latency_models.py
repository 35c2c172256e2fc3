"""Roofline and table step-latency models, and fitting them with ``orcasim calibrate``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.hardware import GPUS, MODELS
from orcasim.latency.fit import fit_linear, fit_roofline
from orcasim.latency.measurements import load_measurements
from orcasim.latency.roofline import RooflineLatency
from orcasim.latency.table import TableLatency
from orcasim.plan import StepPlan
from orcasim.registry import latency_models
from orcasim.request import Request
from orcasim.spec import build_spec
from orcasim.workload.traces import TraceError


def roofline(**kw) -> RooflineLatency:
    return build_spec(latency_models, {"type": "roofline", **kw}, "engine.latency").create()


IDEAL = {"compute_efficiency": 1.0, "bandwidth_efficiency": 1.0, "overhead": 0.0}


def test_decode_at_batch_one_costs_the_weights_over_bandwidth():
    m = roofline(model="llama-2-7b", gpu="a100-80gb", **IDEAL)
    t = m.step_time(StepPlan(1, 0))  # one token, empty context
    weights = 6.74e9 * 2
    assert weights / 2039e9 == pytest.approx(0.00661, abs=1e-5)  # ~13.5 GB / 2.0 TB/s
    # one new token's KV (0.5 MB) is written too: 0.004 % more than the weights alone
    assert t == pytest.approx((weights + 524288) / 2039e9, rel=1e-12)
    parts = m.breakdown(StepPlan(1, 0))
    assert parts["memory"] > 100 * parts["compute"]
    # default efficiencies: 80 % of the bandwidth and 1 ms per step
    assert roofline().step_time(StepPlan(1, 0)) == pytest.approx(t / 0.8 + 0.001, rel=1e-12)


def test_prefill_of_2048_tokens_is_compute_bound():
    m = roofline(**IDEAL)
    plan = StepPlan(1, 0, 2048, 0)
    parts = m.breakdown(plan)
    flops = 2 * 6.74e9 * 2048 + 4 * 32 * 4096 * (2048 * 2049 / 2)
    assert parts["compute"] == pytest.approx(flops / 312e12, rel=1e-12)
    assert parts["compute"] > 10 * parts["memory"]
    assert m.step_time(plan) == parts["compute"]
    assert 0.090 < m.step_time(plan) < 0.095


def test_kv_reads_make_large_decode_batches_memory_bound():
    m = roofline(**IDEAL)
    kv_per_token = 2 * 32 * 32 * 128 * 2
    plan = StepPlan(64, 64 * 1000)
    expected = (6.74e9 * 2 + kv_per_token * (64_000 + 64)) / 2039e9
    assert m.step_time(plan) == pytest.approx(expected, rel=1e-12)


def test_tensor_parallelism_splits_work_and_adds_all_reduces():
    one = roofline(model="llama-2-70b", gpu="h100-80gb", tp=2, **IDEAL)
    four = roofline(model="llama-2-70b", gpu="h100-80gb", tp=4, **IDEAL)
    plan = StepPlan(8, 8 * 512)
    a, b = one.breakdown(plan), four.breakdown(plan)
    assert b["memory"] == pytest.approx(a["memory"] / 2, rel=0.01)
    # 2 all-reduces per layer of N x hidden x 2 bytes, ring volume 2 (tp-1)/tp, over
    # NVLink 4 (450 GB/s one way) at the calibrated 75 % all-reduce efficiency
    comm = 2 * 80 * 8 * 8192 * 2 * 2 * (3 / 4) / (450e9 * 0.75)
    assert b["comm"] == pytest.approx(comm, rel=1e-12)
    assert b["overhead"] == pytest.approx(2 * 80 * 5e-6)
    assert four.step_time(plan) == pytest.approx(
        max(b["compute"], b["memory"]) + b["comm"] + b["overhead"], rel=1e-12)


def test_scheduled_plans_count_attention_per_request():
    m = roofline(**IDEAL)
    a, b = Request(0, 0.0, 600, 5), Request(1, 0.0, 100, 5)
    a.num_computed_tokens = 512  # second chunk of a chunked prefill: 88 tokens after 512
    b.num_computed_tokens = 100
    b.num_output_tokens = 1  # decoding its second token
    plan = StepPlan(2, 612, 88, 1, scheduled=[(a, 88), (b, 1)])
    pairs = 88 * 512 + 88 * 89 // 2 + 100 + 1
    assert m.cost.attention_pairs(plan) == pairs


def test_attention_pairs_are_the_per_request_sum():
    m = roofline(**IDEAL)
    rng = np.random.default_rng(3)
    for k in range(1, 40):
        ns = [int(x) for x in rng.integers(1, 3000, k)]
        ns[: k // 2] = [1] * (k // 2)  # decodes among chunks
        contexts = [int(x) for x in rng.integers(0, 100_000, k)]
        reqs = [Request(i, 0.0, 10, 5) for i in range(k)]
        plan = StepPlan(k, sum(contexts), sum(ns), 0, list(zip(reqs, ns, strict=True)), contexts)
        pairs = 0
        for n, c in zip(ns, contexts, strict=True):
            pairs += n * c + n * (n + 1) // 2
        assert m.cost.attention_pairs(plan) == float(pairs)
        plan.num_singles = k // 2  # the leading one-token requests, said: the same count
        assert m.cost.attention_pairs(plan) == float(pairs)
    with pytest.raises(ValueError):
        m.cost.attention_pairs(StepPlan(1, 0, 2, 0, [(reqs[0], 2)], [1, 2]))
    short = StepPlan(2, 0, 2, 0, [(reqs[0], 1), (reqs[1], 1)], [1])
    short.num_singles = 1
    with pytest.raises(ValueError):
        m.cost.attention_pairs(short)


@pytest.mark.parametrize("kw,field,msg", [
    ({"model": "gpt-5"}, "engine.latency", "unknown model 'gpt-5'"),
    ({"gpu": "tpu"}, "engine.latency", "unknown GPU 'tpu'"),
    ({"model": "llama-2-70b", "gpu": "a100-80gb"}, "engine.latency",
     "llama-2-70b needs 138.0 GB of weights per GPU at tp=1; a a100-80gb has 80 GB"),
    ({"tp": 3}, "engine.latency", "tp (3) must divide the 32 attention heads"),
    ({"compute_efficiency": 1.5}, "engine.latency.compute_efficiency", "less than or equal"),
])
def test_roofline_rejects_impossible_hardware(kw, field, msg):
    with pytest.raises(ScenarioError) as exc:
        build_spec(latency_models, {"type": "roofline", **kw}, "engine.latency")
    assert exc.value.field == field
    assert msg in exc.value.message


def test_presets_are_consistent():
    for m in MODELS.values():
        assert m.num_heads % m.num_kv_heads == 0 and m.hidden_size % m.num_heads == 0
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert GPUS["a100-80gb"].hbm_bandwidth == 2039e9


def linear_truth(b, p, kv):
    return 0.004 + 0.0006 * b + 0.00003 * kv + 0.00008 * p


def write_steps(path: Path, rows) -> str:
    lines = ["batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds"]
    lines += [",".join(f"{v:.17g}" for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_table_interpolates_a_grid_exactly(tmp_path):
    rows = [(b, 0, b, kv, linear_truth(b, 0, kv) + 1e-7 * b * kv / 1000)
            for b in (1, 8, 32) for kv in (0, 4096, 65536)]
    m = TableLatency(TableLatency.Params(file=write_steps(tmp_path / "t.csv", rows)))
    assert m.kind == "grid" and m.inputs == ["batch_size", "kv_tokens"]
    for b, kv in ((1, 0), (8, 4096), (32, 65536)):
        assert m.step_time(StepPlan(b, kv)) == pytest.approx(
            linear_truth(b, 0, kv) + 1e-7 * b * kv / 1000, rel=1e-12)
    # bilinear inside a cell: the corners' weighted mean
    b, kv = 20, 10_000
    fb, fk = (20 - 8) / 24, (10_000 - 4096) / (65536 - 4096)

    def f(b, kv):
        return linear_truth(b, 0, kv) + 1e-7 * b * kv / 1000

    expected = ((1 - fb) * (1 - fk) * f(8, 4096) + fb * (1 - fk) * f(32, 4096)
                + (1 - fb) * fk * f(8, 65536) + fb * fk * f(32, 65536))
    assert m.step_time(StepPlan(b, kv)) == pytest.approx(expected, rel=1e-12)
    # outside the grid: linear extrapolation, or the edge with clamp
    assert m.step_time(StepPlan(64, 0)) == pytest.approx(
        f(32, 0) + (f(32, 0) - f(8, 0)) * (64 - 32) / 24, rel=1e-12)
    clamp = TableLatency(TableLatency.Params(file=str(tmp_path / "t.csv"), extrapolate="clamp"))
    assert clamp.step_time(StepPlan(64, 0)) == pytest.approx(f(32, 0), rel=1e-12)


def test_table_scattered_points_and_repeats(tmp_path):
    rng = np.random.default_rng(0)
    pts = [(int(b), int(p), int(kv)) for b, p, kv in zip(
        rng.integers(1, 64, 60), rng.integers(0, 2048, 60), rng.integers(0, 60_000, 60),
        strict=True)]
    rows = [(b, p, b, kv, linear_truth(b, p, kv)) for b, p, kv in pts]
    rows.append(rows[0])  # a repeated measurement is averaged, not a second point
    m = TableLatency(TableLatency.Params(file=write_steps(tmp_path / "s.csv", rows)))
    assert m.kind == "scattered"
    assert m.inputs == ["batch_size", "prefill_tokens", "kv_tokens"]
    # a linear function is reproduced exactly inside the hull
    inside = np.mean(np.array(pts, dtype=float), axis=0)
    b, p, kv = (int(v) for v in inside)
    assert m.step_time(StepPlan(b, kv, p, b)) == pytest.approx(linear_truth(b, p, kv), rel=1e-9)
    # outside it (one more sequence than the largest batch measured), the nearest measurement
    b, p, _, kv, t = max(rows, key=lambda r: r[0])
    assert m.step_time(StepPlan(b + 1, kv, p, b + 1)) == pytest.approx(t, rel=1e-12)


@pytest.mark.parametrize("edit,line,msg", [
    ("seconds", 1, "missing column 'seconds'"),
    ("0.01", 3, "seconds: '-0.01' is not a finite number >= 0"),
    ("x", 2, "kv_tokens: 'x' is not a number"),
])
def test_bad_measurements_name_the_line(tmp_path, edit, line, msg):
    text = "batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds\n1,0,1,10,0.01\n" \
           "2,0,2,20,0.01\n"
    if edit == "seconds":
        text = text.replace(",seconds", ",secs")
    elif edit == "0.01":
        text = text.replace("20,0.01", "20,-0.01")
    else:
        text = text.replace("1,10,", "1,x,")
    p = tmp_path / "m.csv"
    p.write_text(text)
    with pytest.raises(TraceError) as exc:
        load_measurements(p)
    assert str(exc.value).startswith(f"{p}:{line}: {msg}")


def grid_rows(fn, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for ctx in (128, 512, 1024, 2048):
            rows.append((b, 0, b, b * ctx))
    for n in (128, 256, 512, 1024, 2048, 4096):
        rows.append((1, n, 0, 0))
    out = []
    for b, p, d, kv in rows:
        t = fn(StepPlan(b, kv, p, d)) * (1 + noise * rng.standard_normal())
        out.append((b, p, d, kv, t))
    return out


def test_fit_linear_recovers_exact_coefficients(tmp_path):
    rows = grid_rows(lambda pl: linear_truth(pl.num_seqs, pl.num_prefill_tokens,
                                             pl.num_kv_tokens))
    fit = fit_linear(load_measurements(write_steps(tmp_path / "m.csv", rows)))
    assert fit.values == pytest.approx({"base": 0.004, "per_seq": 0.0006, "per_token": 0.00003,
                                        "per_prefill_token": 0.00008}, rel=1e-6)
    assert fit.errors["max_rel"] < 1e-6


def test_fit_roofline_recovers_efficiencies_within_intervals(tmp_path):
    truth = roofline(compute_efficiency=0.55, bandwidth_efficiency=0.75, overhead=0.002)
    rows = grid_rows(truth.step_time, noise=0.03, seed=1)
    fit = fit_roofline(load_measurements(write_steps(tmp_path / "m.csv", rows)),
                       "llama-2-7b", "a100-80gb")
    for name, value in (("compute_efficiency", 0.55), ("bandwidth_efficiency", 0.75),
                        ("overhead", 0.002)):
        lo, hi = fit.intervals[name]
        assert lo < value < hi, name
        assert fit.values[name] == pytest.approx(value, rel=0.1)


def test_calibrate_prints_yaml_ready_to_paste(tmp_path, capsys):
    rows = [r for r in grid_rows(lambda pl: linear_truth(pl.num_seqs, 0, pl.num_kv_tokens),
                                 noise=0.01) if r[1] == 0]
    path = write_steps(tmp_path / "m.csv", rows)
    assert main(["calibrate", path]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"# linear latency model fitted to 32 measured steps from {path}"
    assert lines[1].startswith("# fit error: RMSE ")
    assert lines[2] == "# 95% confidence intervals:"
    assert "#   per_prefill_token: not fitted (no measured step computes prefill tokens); " \
        "default kept" in lines
    engine = yaml.safe_load(out)["engine"]
    params = build_spec(latency_models, engine["latency"], "engine.latency").params
    assert params.base == pytest.approx(0.004, rel=0.05)
    assert params.per_token == pytest.approx(0.00003, rel=0.05)
    assert params.per_prefill_token == 0.0


def test_calibrate_roofline_from_the_command_line(tmp_path, capsys):
    truth = roofline(model="llama-3.1-8b", gpu="h100-80gb", compute_efficiency=0.5,
                     bandwidth_efficiency=0.7, overhead=0.003)
    path = write_steps(tmp_path / "m.csv", grid_rows(truth.step_time))
    assert main(["calibrate", path, "--model", "roofline", "--llm", "llama-3.1-8b",
                 "--gpu", "h100-80gb"]) == 0
    lat = yaml.safe_load(capsys.readouterr().out)["engine"]["latency"]
    assert lat["model"] == "llama-3.1-8b" and lat["gpu"] == "h100-80gb"
    assert lat["compute_efficiency"] == pytest.approx(0.5, rel=1e-4)
    assert lat["bandwidth_efficiency"] == pytest.approx(0.7, rel=1e-4)
    assert lat["overhead"] == pytest.approx(0.003, rel=1e-3)
    assert main(["calibrate", path, "--model", "roofline", "--llm", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.startswith("orcasim: error: ")

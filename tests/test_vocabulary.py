"""vLLM ``bench serve`` vocabulary, extra summary percentiles and the long summary table.

The scenario is small enough to check by hand. Two slots, continuous
batching; A (prompt 10, 4 tokens) and B (prompt 20, 1 token) arrive at 0,
C (prompt 30, 5 tokens) at 0.5 and takes B's slot after the first step.

``const`` (1 s per step): steps end at 1, 2, ..., 6. A's tokens at 1-4, B's
at 1, C's at 2-6. TTFT 1, 1, 1.5 s; E2E 4, 1, 5.5 s; TPOT 1 s for A and C;
7 inter-token gaps of 1 s.

``linear`` (1 s per sequence in the batch): four steps of two sequences end at
2, 4, 6, 8, then C runs alone to 9 and 10. TTFT 2, 2, 3.5 s; E2E 8, 2, 9.5 s;
TPOT (8-2)/3 = 2 s for A and (10-4)/4 = 1.5 s for C (B has a single token);
ITL: A 2, 2, 2 and C 2, 2, 1, 1, i.e. five gaps of 2 s and two of 1 s.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

import orcasim
from orcasim.cli import main
from orcasim.metrics.results import metric_unit, split_summary_key
from orcasim.metrics.summary import QUANTILES, percentile_suffix
from orcasim.metrics.vocabulary import vllm_bench_metrics

SCENARIO = """\
name: vocab
workload:
  type: list
  requests:
    - {name: A, arrival: 0, prompt_len: 10, output_len: 4, cls: chat, tenant: t1}
    - {name: B, arrival: 0, prompt_len: 20, output_len: 1, cls: batch, tenant: t2}
    - {name: C, arrival: 0.5, prompt_len: 30, output_len: 5, cls: chat, tenant: t1}
engine:
  latency: {type: constant, step_time: 1.0}
policy: {type: continuous, max_batch: 2}
variants:
  const: {}
  linear: {engine: {latency: {type: linear, base: 0.0, per_seq: 1.0, per_token: 0.0}}}
"""


@pytest.fixture
def scenario_path(tmp_path):
    p = tmp_path / "vocab.yaml"
    p.write_text(SCENARIO)
    return p


@pytest.fixture
def res(scenario_path):
    return orcasim.simulate(orcasim.load_scenario(scenario_path), seed=0)


def _approx(expected: dict[str, float]) -> dict[str, object]:
    return {k: pytest.approx(v, rel=1e-12, abs=1e-9) for k, v in expected.items()}


def test_const_variant_in_vllm_keys_and_units(res):
    got = vllm_bench_metrics(res["const"], percentiles=(50, 99))
    std_ttft = math.sqrt((2 * (1000 - 3500 / 3) ** 2 + (1500 - 3500 / 3) ** 2) / 3)
    std_e2el = math.sqrt(((4000 - 3500) ** 2 + (1000 - 3500) ** 2 + (5500 - 3500) ** 2) / 3)
    assert got == _approx({
        "duration": 6.0,
        "completed": 3,
        "total_input_tokens": 60,
        "total_output_tokens": 10,
        "request_throughput": 3 / 6,
        "output_throughput": 10 / 6,
        "total_token_throughput": 70 / 6,
        "mean_ttft_ms": 3500 / 3, "median_ttft_ms": 1000.0, "std_ttft_ms": std_ttft,
        "p50_ttft_ms": 1000.0, "p99_ttft_ms": 1000 + 0.98 * 500,
        "mean_tpot_ms": 1000.0, "median_tpot_ms": 1000.0, "std_tpot_ms": 0.0,
        "p50_tpot_ms": 1000.0, "p99_tpot_ms": 1000.0,
        "mean_itl_ms": 1000.0, "median_itl_ms": 1000.0, "std_itl_ms": 0.0,
        "p50_itl_ms": 1000.0, "p99_itl_ms": 1000.0,
        "mean_e2el_ms": 3500.0, "median_e2el_ms": 4000.0, "std_e2el_ms": std_e2el,
        "p50_e2el_ms": 4000.0, "p99_e2el_ms": 4000 + 0.98 * 1500,
    })
    assert list(got)[:7] == ["duration", "completed", "total_input_tokens",
                             "total_output_tokens", "request_throughput",
                             "output_throughput", "total_token_throughput"]


def test_tpot_excludes_the_first_token_and_itl_uses_every_gap(res):
    got = res["linear"].vllm_bench(percentiles=(25, 99.9))
    # TPOT over A and C only (B has one token): 2 s and 1.5 s, not E2E / tokens (2, 1.9).
    assert got["mean_tpot_ms"] == pytest.approx(1750.0)
    assert got["median_tpot_ms"] == pytest.approx(1750.0)
    assert got["std_tpot_ms"] == pytest.approx(250.0)
    assert got["p25_tpot_ms"] == pytest.approx(1625.0)
    assert got["p99.9_tpot_ms"] == pytest.approx(1999.5)
    # ITL per token: [1, 1, 2, 2, 2, 2, 2] s, so its mean differs from TPOT's per-request mean.
    assert got["mean_itl_ms"] == pytest.approx(12 / 7 * 1000)
    assert got["median_itl_ms"] == pytest.approx(2000.0)
    assert got["std_itl_ms"] == pytest.approx(math.sqrt(10) / 7 * 1000)
    assert got["p25_itl_ms"] == pytest.approx(1500.0)
    assert got["p99.9_itl_ms"] == pytest.approx(2000.0)
    assert got["mean_ttft_ms"] == pytest.approx(2500.0)
    assert got["p99.9_e2el_ms"] == pytest.approx(8000 + 0.998 * 1500)
    assert got["duration"] == 10.0 and got["request_throughput"] == pytest.approx(0.3)
    assert got["output_throughput"] == pytest.approx(1.0)
    assert got["total_token_throughput"] == pytest.approx(7.0)
    assert "p99_itl_ms" not in got and "p90_ttft_ms" not in got


def test_extra_percentiles_leave_the_default_keys_alone(res):
    before = {n: dict(v.summary) for n, v in res.items()}
    res.add_percentiles([25, 50, 99.9])
    s = res["linear"].summary
    assert {k: s[k] for k in before["linear"]} == before["linear"]
    assert [k for k in s if k in before["linear"]] == list(before["linear"])
    assert [k for k in s if k.startswith("ttft_")] == [
        "ttft_mean", "ttft_p25", "ttft_p50", "ttft_p90", "ttft_p99", "ttft_p99_9"]
    assert s["ttft_p25"] == pytest.approx(2.0)
    assert s["e2e_p25"] == pytest.approx(5.0)
    assert s["e2e_p99_9"] == pytest.approx(8 + 0.998 * 1.5)
    assert s["itl_p25"] == pytest.approx(1.5) and s["itl_p99_9"] == pytest.approx(2.0)
    assert s["tpot_p25"] == pytest.approx(1.625)
    assert s["class.chat.e2e_p25"] == pytest.approx(8.375)
    assert math.isnan(s["class.batch.tpot_p25"])
    assert "tenant.t1.ttft_p25" not in s
    assert res["linear"].by_class["chat"]["ttft_p99_9"] == pytest.approx(2 + 0.999 * 1.5)
    assert {k: res["const"].summary[k] for k in before["const"]} == before["const"]


def test_percentile_suffixes():
    assert [percentile_suffix(q) for q in (50, 99.0, 99.9, 0.5)] == [
        "p50", "p99", "p99_9", "p0_5"]
    assert QUANTILES == (50, 90, 99)


def test_extra_itl_percentiles_are_left_out_under_a_window(scenario_path):
    sc = orcasim.load_scenario(scenario_path, {"metrics.warmup": 0.1})
    r = orcasim.simulate(sc, seed=0, variants=["linear"])
    r.add_percentiles([95])
    s = r["linear"].summary
    assert "ttft_p95" in s and "e2e_p95" in s and "itl_p95" not in s


def test_tidy_has_one_row_per_key_with_groups_split(res):
    df = res.tidy()
    assert list(df.columns) == ["variant", "group_kind", "group", "metric", "value", "unit"]
    assert len(df) == sum(len(v.summary) for v in res.values())
    assert df.groupby("variant").size().to_dict() == {n: len(v.summary) for n, v in res.items()}
    row = df[(df.variant == "linear") & (df.group == "chat") & (df.metric == "e2e_p99")]
    assert len(row) == 1 and row.group_kind.item() == "class"
    assert row.value.item() == res["linear"].summary["class.chat.e2e_p99"]
    assert row.unit.item() == "s"
    t = df[(df.variant == "const") & (df.group_kind == "tenant") & (df.group == "t2")]
    assert set(t.metric) == {"num_requests", "num_finished", "output_tokens",
                             "service_tokens", "ttft_p99"}
    whole = df[df.group_kind.isna()]
    assert whole.group.isna().all() and whole.group_kind.tolist()[0] is None
    assert set(whole.metric) == {k for k in res["const"].summary if "." not in k}
    units = dict(zip(whole.metric, whole.unit, strict=False))
    assert units["throughput_tok_s"] == "tok/s" and units["requests_per_s"] == "req/s"
    assert units["makespan_s"] == "s" and units["num_finished"] == "count"
    assert units["slot_utilisation"] == "share" and units["jain_index"] == "share"


def test_split_summary_key_and_units():
    assert split_summary_key("class.a.b.ttft_p99") == ("class", "a.b", "ttft_p99")
    assert split_summary_key("tenant.t1.service_tokens") == ("tenant", "t1", "service_tokens")
    assert split_summary_key("ttft_p99") == (None, None, "ttft_p99")
    assert split_summary_key("classy_metric") == (None, None, "classy_metric")
    assert [metric_unit(m) for m in ("goodput_req_s", "p99_ttft_ms", "itl_mean",
                                     "kv_peak_usage", "swapped_bytes", "output_tokens")] == [
        "req/s", "ms", "s", "share", "bytes", "count"]


def test_run_writes_vllm_and_long_summaries(scenario_path, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(scenario_path), "--metrics", "vllm", "--percentiles", "50,99.9",
                 "--out", str(out), "--no-plots"]) == 0
    vllm = json.loads((out / "summary_vllm.json").read_text())
    assert set(vllm) == {"const", "linear"}
    assert vllm["linear"]["p99.9_itl_ms"] == pytest.approx(2000.0)
    assert vllm["linear"]["median_itl_ms"] == pytest.approx(2000.0)
    assert vllm["const"]["completed"] == 3 and vllm["const"]["duration"] == 6.0
    assert [k for k in vllm["const"] if k.endswith("_ttft_ms")] == [
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms"]
    summary = json.loads((out / "summary.json").read_text())["variants"]
    ref = orcasim.simulate(orcasim.load_scenario(scenario_path), seed=0).summary
    for name, s in summary.items():
        assert {k: s[k] for k in ref[name]} == _jsonable(ref[name])
    assert summary["const"]["ttft_p99_9"] == pytest.approx(1 + 0.998 * 0.5)
    assert summary["linear"]["ttft_p99_9"] == pytest.approx(2 + 0.998 * 1.5)
    long = pd.read_csv(out / "summary_long.csv")
    assert list(long.columns) == ["variant", "group_kind", "group", "metric", "value", "unit"]
    assert len(long) == sum(len(s) for s in summary.values())
    hit = long[(long.variant == "linear") & long.group.isna() & (long.metric == "itl_p99_9")]
    assert hit.value.item() == pytest.approx(2.0) and hit.unit.item() == "s"
    assert len(pd.read_parquet(out / "summary_long.parquet")) == len(long)


def test_run_without_the_options_writes_no_vllm_file(scenario_path, tmp_path):
    assert main(["run", str(scenario_path), "--out", str(tmp_path), "--no-plots"]) == 0
    assert not (tmp_path / "summary_vllm.json").exists()
    assert (tmp_path / "summary_long.csv").exists()
    s = json.loads((tmp_path / "summary.json").read_text())["variants"]["const"]
    assert not any(k.endswith("_p99_9") for k in s)


@pytest.mark.parametrize("bad", ["50,abc", "101", "-1", "nan", ""])
def test_bad_percentiles_are_a_usage_error(scenario_path, tmp_path, bad, capsys):
    assert main(["run", str(scenario_path), "--percentiles", bad, "--out", str(tmp_path)]) == 2
    assert "--percentiles" in capsys.readouterr().err


def _jsonable(d):
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

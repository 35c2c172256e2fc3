"""The command line's outputs and the notebook-facing Python API."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import orcasim
from orcasim.cli import main


def test_run_default_scenario_writes_outputs(tmp_path, capsys):
    rc = main(["run", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "scenario seed_orca (seed_orca.yaml), seed 0, variants: static, continuous")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["scenario"] == "seed_orca" and summary["seed"] == 0
    s = summary["variants"]
    assert set(s) == {"static", "continuous"}
    for key in ("throughput_tok_s", "queue_delay_p99", "ttft_p99", "e2e_p99", "tpot_p50",
                "itl_p99", "num_finished", "num_rejected", "requests_per_s"):
        assert key in s["static"] and key in s["continuous"]
    assert s["continuous"]["throughput_tok_s"] == pytest.approx(198.49600095812394, rel=1e-12)
    assert summary["config"]["static"]["policy"] == {
        "type": "static", "max_batch": 32, "prefill": False, "kv_admission": "head_of_line",
        "preemption": "recompute", "victim": "last_admitted", "watermark": 0.0}
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert not (tmp_path / "requests.csv").exists()  # only with --csv
    assert len(req) == 1000 and list(req["variant"].unique()) == ["static", "continuous"]
    assert (req["state"] == "finished").all()
    for png in ("gantt.png", "latency_cdf.png", "timeline.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "steps.csv").exists()


def test_seed_flag_changes_the_workload(tmp_path):
    assert main(["run", "--seed", "5", "--out", str(tmp_path), "--no-plots",
                 "--variant", "continuous"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["seed"] == 5 and list(s["variants"]) == ["continuous"]
    ref = orcasim.simulate(seed=5, variants=["continuous"]).summary["continuous"]
    assert s["variants"]["continuous"]["e2e_p99"] == ref["e2e_p99"]


def test_unknown_variant_is_an_error(tmp_path, capsys):
    assert main(["run", "--variant", "nope", "--out", str(tmp_path)]) == 2
    assert "no variant 'nope'" in capsys.readouterr().err


def test_policies_and_scenarios_lists(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()]
    assert names == sorted(names) and {"continuous", "static", "fcfs", "priority"} <= set(names)
    assert main(["scenarios"]) == 0
    assert "seed_orca" in capsys.readouterr().out


def test_same_seed_same_results_bit_for_bit():
    a = orcasim.simulate(seed=3)
    b = orcasim.simulate(seed=3)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    for name in a.summary:
        assert list(a.summary[name]) == list(b.summary[name])
        assert np.array_equal(list(a.summary[name].values()), list(b.summary[name].values()),
                              equal_nan=True)
    c = orcasim.simulate(seed=4)
    assert not a.requests["arrival"].equals(c.requests["arrival"])


def test_python_api_override_and_frames():
    sc = orcasim.load_scenario().override({"workload.num_requests": 50, "policy.max_batch": 4})
    assert [v.policy.params.max_batch for v in sc.variants] == [4, 4]
    res = orcasim.simulate(sc, seed=1)
    df = res.requests
    assert list(df.columns[:3]) == ["variant", "id", "name"]
    assert len(df) == 100
    fin = df[df["state"] == "finished"]
    np.testing.assert_allclose(fin["e2e"], fin["finish"] - fin["arrival"])
    np.testing.assert_allclose(fin["queue_delay"], fin["first_scheduled"] - fin["arrival"])
    assert (fin["ttft"] >= fin["queue_delay"]).all()
    assert res.summary_frame().loc["num_finished"].tolist() == [50, 50]
    assert set(res.step_series["variant"]) == {"static", "continuous"}
    assert res.steps is None


def test_goodput_under_slo():
    sc = orcasim.load_scenario().override({"metrics.slo": {"e2e": 100.0}})
    res = orcasim.simulate(sc)
    for name, v in res.items():
        df = v.requests
        good = ((df["state"] == "finished") & (df["e2e"] <= 100.0)).sum()
        assert v.summary["goodput_req_s"] == pytest.approx(good / v.summary["makespan_s"])
        assert v.summary["slo_attainment"] == pytest.approx(good / 500), name

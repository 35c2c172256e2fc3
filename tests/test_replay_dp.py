"""Replays of data-parallel runs: one engine per DP rank behind vLLM's load balancer, and
expert parallelism for MoE models."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml
from conftest import ROOT
from test_replay import make_run, read_csv

import orcasim
from orcasim.cli import main
from orcasim.replay.plots import engines_summed
from orcasim.replay.scenario import build_scenario

QWEN_MOE_DP2 = {"model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "vllm_version": "0.19.0",
                "engine_kwargs": {"tensor_parallel_size": 1, "data_parallel_size": 2,
                                  "enable_expert_parallel": True, "max_num_seqs": 128,
                                  "max_num_batched_tokens": 2048},
                "num_gpu_blocks": 1000}


def test_dp_moe_run_is_two_engines_with_experts_spread_over_both(tmp_path):
    sc = build_scenario(QWEN_MOE_DP2, "meta.json", tmp_path / "w.jsonl", profiles=tmp_path)
    assert sc["cluster"] == {"router": {"type": "least_outstanding"}, "staleness": 0,
                             "groups": [{"name": "dp", "count": 2, "lockstep": True}]}
    lat = sc["engine"]["latency"]
    assert (lat["expert_parallel"], lat["hidden_size"], lat["num_experts"],
            lat["experts_per_token"], lat["tp"]) == (2, 2048, 128, 8, 1)
    assert (lat["allreduce_bandwidth"], lat["allreduce_latency"]) == (16e9, 20e-6)
    assert sc["policy"]["max_num_seqs"] == 128 and sc["policy"]["num_blocks"] == 1000
    # without enable_expert_parallel: two engines, each with every expert
    meta = {**QWEN_MOE_DP2, "engine_kwargs": {**QWEN_MOE_DP2["engine_kwargs"],
                                               "enable_expert_parallel": False}}
    sc = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=tmp_path)
    assert sc["cluster"]["groups"] == [{"name": "dp", "count": 2, "lockstep": True}]
    assert "expert_parallel" not in sc["engine"]["latency"]
    assert "hidden_size" not in sc["engine"]["latency"]
    # the roofline: two engines too, the experts not spread
    sc = build_scenario(QWEN_MOE_DP2, "meta.json", tmp_path / "w.jsonl", profiles=None,
                        gpu="rtx-pro-6000")
    assert sc["cluster"]["groups"] == [{"name": "dp", "count": 2, "lockstep": True}]
    assert sc["engine"]["latency"] == {"type": "roofline", "model": "qwen3-30b-a3b",
                                       "gpu": "rtx-pro-6000", "tp": 1}
    # a dense model's DP engines are independent in vLLM: no lockstep
    meta = {**QWEN_MOE_DP2, "model": "Qwen/Qwen3-32B"}
    sc = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=tmp_path)
    assert sc["cluster"]["groups"] == [{"name": "dp", "count": 2}]
    # one engine: no cluster section
    meta = {**QWEN_MOE_DP2, "engine_kwargs": {**QWEN_MOE_DP2["engine_kwargs"],
                                               "data_parallel_size": 1}}
    assert "cluster" not in build_scenario(meta, "meta.json", tmp_path / "w.jsonl",
                                           profiles=tmp_path)


def test_expert_parallel_with_tp_engines_is_refused(tmp_path, capsys):
    meta = {**QWEN_MOE_DP2, "engine_kwargs": {**QWEN_MOE_DP2["engine_kwargs"],
                                               "tensor_parallel_size": 2}}
    run, workload, profile = make_run(tmp_path, {**meta, "model": meta["model"]})
    assert main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                 str(profile), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "TP1 engines only" in err and "\n" not in err


def test_dp_replay_routes_to_the_least_loaded_engine_and_reruns(tmp_path, capsys):
    run, workload, profile = make_run(tmp_path, {"engine_kwargs": {
        "model": "toy/Toy-1B", "tensor_parallel_size": 1, "data_parallel_size": 2,
        "max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 256}})
    out = tmp_path / "out"
    assert main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                 str(profile), "--out", str(out)]) == 0
    capsys.readouterr()
    assert (out / "running_waiting.png").is_file()
    res = orcasim.simulate(orcasim.load_scenario(out / "scenario.yaml"))
    variant = next(iter(res.variants.values()))
    # requests 0 and 1 arrive at empty engines: the lowest index, then the other one; the
    # third finds one outstanding on each and goes to the lowest index
    assert variant.columns["replica"][:3] == ["dp-0", "dp-1", "dp-0"]
    per_request = read_csv(out / "requests.csv")
    assert [float(r["predicted_e2e_ms"]) for r in per_request] == pytest.approx(
        (variant.requests.e2e * 1e3).tolist(), rel=1e-5)
    assert yaml.safe_load((out / "scenario.yaml").read_text())["cluster"]["groups"] == [
        {"name": "dp", "count": 2}]


def test_engines_summed_adds_each_engines_last_counts_at_every_step_start():
    steps = {"t_start": np.array([0.0, 1.0, 0.5, 2.0]), "replica": np.array([0, 0, 1, 1]),
             "batch_size": np.array([1, 3, 2, 5]), "num_waiting": np.array([0, 1, 4, 0])}
    got = engines_summed(steps)
    assert got["t_start"].tolist() == [0.0, 0.5, 1.0, 2.0]
    assert got["batch_size"].tolist() == [1, 3, 5, 8]
    assert got["num_waiting"].tolist() == [0, 4, 5, 1]
    one = {"t_start": np.array([0.0]), "batch_size": np.array([1]), "num_waiting": np.array([0])}
    assert engines_summed(one) is one


# -- the other measured runs on docs/real-gpu.md -------------------------------------------------

REAL = ROOT.parent / "shared" / "realdata"
RUNS = ROOT / "tests" / "data" / "llmservingsim_runs"
OTHER_RUNS = {  # heading on the page: (run folder, workload, profiles, GPU preset, extra)
    "RTX 4090, Llama-3.1-8B, TP1": (
        "RTX4090_Llama-3.1-8B", "sharegpt-llama-3.1-8b-300-sps10.jsonl",
        "RTX4090/meta-llama/Llama-3.1-8B/bf16", "rtx-4090", []),
    "RTX PRO 6000 x2, Qwen3-32B, TP2": (
        "RTXPRO6000_Qwen3-32B", "sharegpt-qwen3-32b-300-sps10.jsonl",
        "RTXPRO6000/Qwen/Qwen3-32B/bf16", "rtx-pro-6000", ["--gpu-memory-gb", "96"]),
    "RTX PRO 6000 x2, Qwen3-30B-A3B (MoE), two data-parallel engines with expert parallelism": (
        "RTXPRO6000_Qwen3-30B-A3B-Instruct-2507", "sharegpt-qwen3-32b-300-sps10.jsonl",
        "RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", "rtx-pro-6000",
        ["--gpu-memory-gb", "96"]),
}


def test_shipped_run_copies_are_the_runs_their_readme_names():
    from orcasim.replay.measured import load_run

    for folder, *_ in OTHER_RUNS.values():
        run = load_run(RUNS / folder)
        assert len(run.request_ids) == 300, folder
    assert (RUNS / "LICENSE").read_text().startswith("MIT License")
    assert "5daddb21a545658d5150b535712d0494584b5278" in (RUNS / "README.md").read_text()


@pytest.mark.skipif(not (REAL / "profiles").is_dir(), reason="shared/realdata not present")
def test_the_other_measured_runs_tables_are_what_the_replay_gives(tmp_path, capsys):
    """Every figure of the "Other measured runs" tables on docs/real-gpu.md, both models."""
    text = (ROOT / "docs" / "real-gpu.md").read_text().split("## Other measured runs")[1]
    text = text.split("\n## ")[0]
    sections = re.split(r"^### ", text, flags=re.M)[1:]
    assert [s.splitlines()[0] for s in sections] == list(OTHER_RUNS)
    for section in sections:
        folder, workload, profiles, gpu, extra = OTHER_RUNS[section.splitlines()[0]]
        rows = re.findall(r"^\| (TTFT|TPOT|E2E) (mean|median|p90|p99) \| ([\d,.]+) \| "
                          r"([\d,.]+) \| ([+-][\d.]+)% \| ([\d,.]+) \| ([+-][\d.]+)% \|$",
                          section, re.M)
        assert len(rows) == 12, folder
        base = ["replay-vllm", str(RUNS / folder), "--workload",
                str(REAL / "workloads" / workload), "--no-plots", *extra]
        got = {}
        for name, model in (("profile", ["--profiles", str(REAL / "profiles" / profiles)]),
                            ("roofline", ["--gpu", gpu])):
            out = tmp_path / f"{folder}-{name}"
            assert main([*base, *model, "--out", str(out)]) == 0
            got[name] = {r["metric"]: r for r in read_csv(out / "comparison.csv")}
        capsys.readouterr()
        for metric, stat, measured, prof, prof_err, roof, roof_err in rows:
            key = f"{metric.lower()}_{stat}_ms"
            digits = 1 if metric == "TPOT" else 0
            for name, value, err in (("profile", prof, prof_err), ("roofline", roof, roof_err)):
                r = got[name][key]
                assert round(float(r["measured"]), digits) == float(measured.replace(",", ""))
                assert round(float(r["predicted"]), digits) == float(value.replace(",", "")), \
                    (folder, name, key)
                assert f"{float(r['error_pct']):+.1f}" == err, (folder, name, key)

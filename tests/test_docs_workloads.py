"""Every YAML example in docs/workloads.md and docs/latency.md validates and generates."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml
from conftest import ROOT

import orcasim
from orcasim.registry import arrivals, latency_models
from orcasim.simulation import generate_workload
from orcasim.spec import build_spec

BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def examples(doc: str) -> list[dict]:
    text = (ROOT / "docs" / doc).read_text()
    return [yaml.safe_load(b) for b in BLOCK.findall(text)]


@pytest.mark.parametrize("example", examples("workloads.md"), ids=lambda e: next(iter(e)))
def test_workload_examples(example):
    if "arrival" in example:
        t = build_spec(arrivals, example["arrival"], "arrival").create().sample(
            np.random.default_rng(0), 100)
        assert len(t) == 100 and np.all(np.diff(t) >= 0)
        return
    if "classes" in example:
        workload = {"type": "synthetic", "num_requests": 40,
                    "arrival": {"type": "poisson", "rate": 1.0},
                    "prompt_len": {"type": "fixed", "value": 10},
                    "output_len": {"type": "fixed", "value": 5}, **example}
    else:
        workload = example["workload"]
        if workload["type"] == "trace" and "end" in workload:
            workload = {**workload, "file": "azure_conv", "start": 60, "end": 120}
        if workload["type"] in ("closed_loop", "sessions"):
            workload = {**workload, next(k for k in ("num_clients", "num_sessions")
                                         if k in workload): 3}
    sc = orcasim.Scenario({"workload": workload, "policy": "continuous",
                           "engine": {"latency": {"type": "constant", "step_time": 0.01}}})
    arrays = generate_workload(sc.variants[0])
    assert len(arrays) > 0
    res = orcasim.simulate(sc)
    assert res.summary["continuous"]["num_finished"] == len(arrays)


@pytest.mark.parametrize("example", [e for e in examples("latency.md") if "engine" in e])
def test_latency_examples(example):
    spec = build_spec(latency_models, example["engine"]["latency"], "engine.latency")
    if spec.type != "table":
        assert spec.create().step_time(orcasim.StepPlan(8, 8 * 512)) > 0


def test_calibrate_example_output_is_the_documented_one(tmp_path, monkeypatch, capsys):
    import importlib.util

    from orcasim.cli import main

    spec = importlib.util.spec_from_file_location(
        "calibrate_example", ROOT / "docs" / "studies" / "calibrate_example.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.chdir(tmp_path)
    mod.write_steps("steps.csv")
    assert main(["calibrate", "steps.csv", "--model", "roofline"]) == 0
    out = capsys.readouterr().out
    doc = (ROOT / "docs" / "latency.md").read_text()
    documented = doc.split("$ orcasim calibrate steps.csv --model roofline\n", 1)[1]
    assert documented.startswith(out)

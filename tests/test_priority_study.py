"""The priority-classes acceptance claims, on the study's own code (docs/studies)."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def study():
    path = ROOT / "docs" / "studies" / "priority_tradeoff.py"
    spec = importlib.util.spec_from_file_location("priority_tradeoff", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def summary(study):
    return {r["setting"]: r for r in study.table(study.runs(range(3)))}


RISING = ["share-1", "share-2", "share-4", "share-8", "strict", "strict-preempt"]


def test_interactive_ttft_falls_as_its_priority_rises(summary):
    ttft = [summary[s]["interactive_ttft_p99"] for s in RISING]
    assert ttft == sorted(ttft, reverse=True) and len(set(ttft)) == len(ttft)
    assert ttft[0] > 10 * ttft[-1]
    # equal shares are no better than first come, first served
    assert summary["share-1"]["interactive_ttft_p99"] > 0.8 * summary["fcfs"][
        "interactive_ttft_p99"]


def test_batch_traffic_pays_for_it(summary):
    batch = [summary[s]["batch_tok_s"] for s in RISING]
    assert batch == sorted(batch, reverse=True) and len(set(batch)) == len(batch)
    assert batch[-1] < 0.6 * batch[0]
    interactive = [summary[s]["interactive_tok_s"] for s in RISING]
    assert interactive == sorted(interactive)
    # only the preemptive setting preempts, and every seed was counted
    assert summary["strict-preempt"]["num_preemptions"] > 0
    assert summary["strict"]["num_preemptions"] == 0
    assert {r["seeds"] for r in summary.values()} == {3}


def test_t_interval(study):
    mean, half = study.t_interval([1.0, 2.0, 3.0, 4.0])
    # t(0.975, 3) = 3.182446; sd = 1.290994; half = t * sd / 2 = 2.054260
    assert mean == 2.5 and half == pytest.approx(2.054260, abs=1e-6)


def test_the_plot_is_written(study, summary, tmp_path):
    path = study.plot(list(summary.values()), tmp_path / "tradeoff.png")
    assert path.stat().st_size > 10_000
    text = study.markdown(list(summary.values()))
    assert text.count("\n") == 1 + len(summary) and "strict-preempt" in text

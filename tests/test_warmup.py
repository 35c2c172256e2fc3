"""The warm-up/cool-down window: off by default; when on, latencies of in-window requests."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

import orcasim
from orcasim.context import SchedulerContext
from orcasim.engine import Engine
from orcasim.metrics.recorder import Recorder
from orcasim.simulation import generate_workload
from orcasim.source import OpenLoopSource
from orcasim.workload.base import WorkloadArrays


def test_off_by_default_and_validated():
    m = orcasim.load_scenario().variants[0].metrics
    assert (m.warmup, m.cooldown) == (0.0, 0.0)
    assert "window_start_s" not in orcasim.simulate().summary["continuous"]
    with pytest.raises(orcasim.ScenarioError) as err:
        orcasim.load_scenario(overrides=["metrics.warmup=0.6", "metrics.cooldown=0.4"])
    assert str(err.value) == ("seed_orca.yaml: metrics: warmup + cooldown must be "
                              "< 1 (fractions of the arrival span)")


def test_window_metrics_equal_the_in_window_requests():
    base = orcasim.load_scenario().override({"workload.arrival.rate": 2.0})
    windowed = base.override({"metrics.warmup": 0.2, "metrics.cooldown": 0.1})
    full = orcasim.simulate(base, seed=4)["continuous"]
    win = orcasim.simulate(windowed, seed=4)["continuous"]
    s = win.summary
    req = full.requests
    last = req["arrival"].max()
    assert (s["window_start_s"], s["window_end_s"]) == (0.2 * last, 0.9 * last)
    inside = req[(req["arrival"] >= 0.2 * last) & (req["arrival"] <= 0.9 * last)]
    assert s["num_in_window"] == len(inside) == 336
    fin = inside[inside["state"] == "finished"]
    for m in ("queue_delay", "ttft", "tpot", "e2e"):
        assert s[f"{m}_mean"] == pytest.approx(fin[m].mean(), rel=1e-12)
        assert s[f"{m}_p99"] == np.percentile(fin[m].dropna(), 99)
    # whole-run numbers stay whole-run
    for m in ("num_requests", "num_finished", "makespan_s", "throughput_tok_s", "num_steps"):
        assert s[m] == full.summary[m]
    assert s["e2e_p99"] != full.summary["e2e_p99"]


def test_window_itl_uses_the_steps_that_ended_inside():
    # 2 slots, step time 1 + batch size seconds; arrivals at 0, 2, 5, 10 -> window [1, 8] s
    sc = orcasim.load_scenario("article_two_slots").override({
        "workload.requests": [
            {"arrival": 0, "prompt_len": 0, "output_len": 3},
            {"arrival": 2, "prompt_len": 0, "output_len": 4},
            {"arrival": 5, "prompt_len": 0, "output_len": 2},
            {"arrival": 10, "prompt_len": 0, "output_len": 3}],
        "engine.latency": {"type": "linear", "base": 1.0, "per_seq": 1.0, "per_token": 0.0},
        "metrics.warmup": 0.1, "metrics.cooldown": 0.2})
    s = orcasim.simulate(sc, variants=["continuous"])["continuous"].summary
    assert (s["window_start_s"], s["window_end_s"]) == (1.0, 8.0)
    assert s["num_in_window"] == 2  # the requests arriving at 2 and 5
    full = orcasim.simulate(sc.override({"metrics.warmup": 0, "metrics.cooldown": 0}),
                            variants=["continuous"])["continuous"]
    assert full.requests["finish"].tolist() == [8.0, 14.0, 14.0, 20.0]
    # gaps between a request's tokens: 3 s in the two-request steps ending at 5, 8, 11, 14
    # (1, 2, 1, 2 tokens), 2 s for D alone (steps ending 18, 20); the window keeps 5 and 8
    assert full.summary["itl_mean"] == (3 * 6 + 2 * 2) / 8
    assert s["itl_mean"] == 3.0 and s["itl_p50"] == 3.0
    # the in-window requests B and C: E2E 12 and 9 s
    assert s["e2e_mean"] == 10.5 and full.summary["e2e_mean"] == (8 + 12 + 9 + 10) / 4


def test_recorder_itl_times_line_up_with_samples():
    sc = orcasim.load_scenario().override({"workload.num_requests": 40})
    cfg = sc.variant("continuous")
    arrays: WorkloadArrays = generate_workload(cfg, 1)
    env = simpy.Environment()
    rec = Recorder(trace_steps=True)
    ctx = SchedulerContext(env, rec)
    OpenLoopSource(env, ctx, arrays)
    Engine(env, ctx, cfg.policy.create(ctx), cfg.latency.create())
    env.run()
    gaps, counts = rec.itl_samples()
    times = rec.itl_times()
    ends = np.array([t1 for _, _, t1, _ in rec.steps])
    assert times.shape == gaps.shape and np.isin(times, ends).all()
    # each sample's gap is its step's end minus the previous step's end
    prev = dict(zip(ends[1:], ends[:-1], strict=True))
    assert np.allclose(gaps, [t - prev.get(t, 0.0) for t in times], rtol=0, atol=1e-12)
    assert counts.sum() == sum(n - 1 for n in full_output_tokens(rec))


def full_output_tokens(rec):
    return rec.request_columns()["num_output_tokens"].tolist()

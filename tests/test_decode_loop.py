"""The engine's loop over whole runs of a continuous batch against the policy's own runs and
against step-by-step simulation.

:class:`~orcasim.policies.decode_loop.FcfsDecodeLoop` takes run after run of an unlimited
``continuous`` batch in one frame, with requests as workload rows. Every test runs the same
model three ways (the loop; runs through the policy and recorder, ``FcfsDecodeLoop.enabled =
False``; one event per step, ``Engine.fast_paths = False``) and compares everything the run
records, down to the order in which request rows were written.
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.metrics import row_spill
from orcasim.policies.decode_loop import FcfsDecodeLoop
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import assert_identical, running_ids, snapshot, watch_and_stop

WAYS = ("loop", "runs", "steps")


def run_three(overrides: dict, n: int = 1500, watch: float | None = None,
              stop_at: float | None = None) -> dict[str, dict]:
    """The seed scenario's ``continuous`` variant with ``overrides``, each way; ``watch``: a
    process wakes every ``watch`` seconds (runs end before it: the loop hands them to the
    engine); ``stop_at``: a hard stop then."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variant("continuous")
    arrays = generate_workload(cfg)
    out = {}
    for way in WAYS:
        Engine.fast_paths = way != "steps"
        FcfsDecodeLoop.enabled = way == "loop"
        try:
            m = build_model(cfg, arrays)
            seen = watch_and_stop(m, len(arrays), watch, stop_at, running_ids)
            m.env.run()
        finally:
            Engine.fast_paths = True
            FcfsDecodeLoop.enabled = True
        rec = m.recorder
        assert (m.engine._loop is not None) == (way == "loop")
        rec._write_done()
        out[way] = {
            "order": np.frombuffer(rec._i["id"], dtype=np.int64).copy() if rec._i["id"] else
            np.zeros(0, np.int64),
            "num_recorded": rec.num_recorded,
            "num_arrived": rec.num_arrived,
            "num_started": m.ctx.num_started,
            "seen": seen,
            **snapshot(m),
        }
    return out


def assert_three_identical(out: dict[str, dict]) -> None:
    loop = out["loop"]
    for way in ("runs", "steps"):
        other = out[way]
        assert_identical(other, loop)
        np.testing.assert_array_equal(other["order"], loop["order"], err_msg=way)
        for key in ("num_recorded", "num_arrived", "num_started", "seen"):
            assert other[key] == loop[key], (way, key)


SCENARIOS = {
    "seed": {},  # overloaded: the batch is full, runs end at finishes
    "light": {"workload.arrival.rate": 1.5, "policy.max_batch": 4},  # idle gaps, arrivals
    "one_slot": {"policy.max_batch": 1},
    # a decode step as a function of the KV tokens, and a step time from the plan
    "roofline": {"engine.latency": {"type": "roofline", "model": "llama-2-7b",
                                    "gpu": "a100-80gb"}, "workload.arrival.rate": 10.0},
    "constant": {"engine.latency": {"type": "constant", "step_time": 0.05},
                 "workload.arrival.rate": 8.0},
    # per-request attributes: requests join as objects
    "classes": {"workload.classes": [{"name": "gold", "weight": 1, "priority": 1,
                                      "tenant": "t1"}, {"name": "std", "weight": 3}]},
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_loop_equals_policy_runs_and_steps(name):
    out = run_three(SCENARIOS[name])
    assert_three_identical(out)
    assert out["loop"]["events"] < 10  # the loop made every run: no events at all
    assert len(out["loop"]["order"]) == 1500


@pytest.mark.parametrize("name", ["seed", "light", "classes"])
def test_loop_hands_runs_to_the_engine_before_other_events(name):
    """A process with a timer: the loop stops before each run that ends after it, with the
    members that joined made into requests, and resumes after."""
    out = run_three(SCENARIOS[name], n=600, watch=0.37)
    assert_three_identical(out)
    assert len(out["loop"]["seen"]) > 100
    assert any(ids for *_, ids in out["loop"]["seen"])


def test_a_hard_stop_after_loop_runs():
    out = run_three({}, n=400, stop_at=7.001)
    assert_three_identical(out)
    reasons = set(out["loop"]["columns"]["reason"])
    assert reasons == {None, "test_stop", "stopped"}


def test_loop_rows_reach_the_spill_at_the_same_rows(monkeypatch):
    monkeypatch.setattr(row_spill, "STREAM_ABOVE", 0)
    monkeypatch.setattr(row_spill, "SPILL_ROWS", 7)
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": 300})
    cfg = sc.variant("continuous")
    arrays = generate_workload(cfg)
    cols = []
    for enabled in (True, False):
        FcfsDecodeLoop.enabled = enabled
        try:
            m = build_model(cfg, arrays)
            m.env.run()
        finally:
            FcfsDecodeLoop.enabled = True
        assert (m.engine._loop is not None) == enabled
        spilled = m.recorder.request_columns(take=True)
        cols.append({k: np.asarray(spilled[k]).tolist() for k in ("id", "finish", "first_token",
                                                                  "state", "arrival")})
    assert cols[0] == cols[1]
    assert len(cols[0]["id"]) == 300


@pytest.mark.parametrize("run", [1, 3, 64])
def test_rows_held_and_written_in_blocks_equal_rows_recorded_one_by_one(monkeypatch, run):
    """Requests and workload rows held by ``record_finished`` (mixed, across spill blocks)
    give the rows ``record_request`` writes, in the same order; ``num_recorded`` counts the
    held rows without writing them. ``run``: rows of one kind written on their own (fewer
    are written with the other kind's in one pass; 1: never)."""
    from orcasim.metrics import request_rows
    from orcasim.metrics.recorder import Recorder
    from orcasim.request import Request, RequestState

    monkeypatch.setattr(request_rows, "DONE_BLOCK", 5)
    monkeypatch.setattr(request_rows, "_RUN", run)
    arrival = np.linspace(0.0, 3.0, 40)
    prompt = np.arange(40, dtype=np.int64) + 7
    output = np.arange(40, dtype=np.int64) % 9 + 1

    def finished(k: int, t: float) -> Request:
        req = Request(k, float(arrival[k]), int(prompt[k]), int(output[k]),
                      name=f"r{k}" if k % 4 == 1 else None)
        req.state = RequestState.FINISHED
        req.first_scheduled, req.first_token = t - 0.5, t - 0.25
        req.num_output_tokens = req.output_len
        req.num_preemptions = k % 3 if k % 4 == 1 else 0  # (a row: none)
        req.tenant = "t" if k % 8 == 1 else None
        req.finish = req.last_token = t
        return req

    one, held = Recorder(spill_rows=11, expected_rows=40), Recorder(spill_rows=11,
                                                                    expected_rows=40)
    assert held.set_row_source("src", arrival, prompt, output)
    assert not held.set_row_source("other", arrival, prompt, output)
    for k in range(40):
        t = 4.0 + k
        req = finished(k, t)
        one.record_request(req)
        if k % 4 == 1:  # a request with attributes, as an object
            held.record_finished([req])
        else:  # a workload row: index, first scheduled, first token, finish
            held.record_finished([[k, t - 0.5, t - 0.25, t]])
        assert held.num_recorded == one.num_recorded == k + 1
    a, b = one.request_columns(take=True), held.request_columns(take=True)
    for name in ("id", "arrival", "first_scheduled", "first_token", "finish", "prompt_len",
                 "output_len", "num_output_tokens", "num_preemptions", "priority", "state",
                 "name", "reason", "tenant"):
        assert np.asarray(a[name]).tolist() == np.asarray(b[name]).tolist(), name

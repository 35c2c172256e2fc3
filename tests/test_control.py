"""Drain and hard stop at given times; no request is ever lost."""

from __future__ import annotations

import pytest

import orcasim

UNIT = {"type": "constant", "step_time": 1.0}


def run(requests, events, policy=None, admission=None):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": UNIT},
        "policy": policy or {"type": "fcfs", "max_batch": 1},
        "events": events,
        "admission": admission or [],
    })
    return next(iter(orcasim.simulate(sc, trace_steps=True).values()))


def outcome(v):
    df = v.requests.set_index("name")
    cols = zip(df.index, df["state"], df["reason"], df["num_output_tokens"], strict=True)
    return {n: (s, r if isinstance(r, str) else None, k) for n, s, r, k in cols}


def test_drain_rejects_new_arrivals_and_finishes_the_rest():
    reqs = [{"name": n, "arrival": t, "prompt_len": 1, "output_len": 2}
            for n, t in [("a", 0), ("b", 1), ("c", 1.5), ("d", 3)]]
    v = run(reqs, [{"type": "drain", "at": 1.5}])
    assert outcome(v) == {"a": ("finished", None, 2), "b": ("finished", None, 2),
                          "c": ("rejected", "draining", 0), "d": ("rejected", "draining", 0)}
    assert v.summary["rejected_draining"] == 2
    assert v.summary["makespan_s"] == 4.0


@pytest.mark.parametrize("policy", [{"type": "fcfs", "max_batch": 1},
                                    {"type": "continuous", "max_batch": 1}])
def test_hard_stop_aborts_in_flight_and_queued(policy):
    reqs = [{"name": "a", "arrival": 0, "prompt_len": 1, "output_len": 5},
            {"name": "b", "arrival": 0, "prompt_len": 1, "output_len": 2},
            {"name": "c", "arrival": 10, "prompt_len": 1, "output_len": 1}]
    v = run(reqs, [{"type": "hard_stop", "at": 2.5}], policy=policy)
    # a emitted 2 tokens (steps ending at 1 and 2); its third step is lost at 2.5
    assert outcome(v) == {"a": ("aborted", "hard_stop", 2), "b": ("aborted", "hard_stop", 0),
                          "c": ("rejected", "stopped", 0)}
    s = v.summary
    assert (s["num_steps"], s["num_aborted"], s["num_rejected"]) == (2, 2, 1)
    assert v.requests.set_index("name")["finish"].to_dict()["a"] == 2.5
    assert s["makespan_s"] == 2.5 and s["busy_fraction"] == 1.0


def test_hard_stop_while_idle_and_after_the_end():
    reqs = [{"name": "a", "arrival": 0, "prompt_len": 1, "output_len": 1},
            {"name": "b", "arrival": 5, "prompt_len": 1, "output_len": 1}]
    v = run(reqs, [{"type": "hard_stop", "at": 3, "reason": "maintenance"}])
    assert outcome(v) == {"a": ("finished", None, 1), "b": ("rejected", "stopped", 0)}
    v = run(reqs, [{"type": "hard_stop", "at": 100}])
    assert outcome(v)["b"] == ("finished", None, 1)


def test_drain_then_hard_stop_and_custom_reason():
    reqs = [{"name": n, "arrival": t, "prompt_len": 1, "output_len": 3}
            for n, t in [("a", 0), ("b", 0), ("c", 2)]]
    v = run(reqs, [{"type": "drain", "at": 1}, {"type": "hard_stop", "at": 4.5,
                                                "reason": "node_failure"}])
    assert outcome(v) == {"a": ("finished", None, 3), "b": ("aborted", "node_failure", 1),
                          "c": ("rejected", "draining", 0)}
    assert v.summary["aborted_node_failure"] == 1


def test_every_run_conserves_requests_with_events_and_admission():
    sc = orcasim.load_scenario().override({
        "workload.num_requests": 400, "workload.arrival.rate": 5.0,
        "admission": [{"type": "max_queue", "limit": 40}],
        "events": [{"type": "drain", "at": 40}, {"type": "hard_stop", "at": 70}]})
    for v in orcasim.simulate(sc, seed=1).values():
        s = v.summary
        assert s["num_finished"] + s["num_rejected"] + s["num_aborted"] == 400
        assert s["rejected_queue_full"] + s["rejected_draining"] + s.get(
            "rejected_stopped", 0) == s["num_rejected"]
        assert s["num_aborted"] == s["aborted_hard_stop"] > 0
        assert s["rejected_queue_full"] > 0 and s["rejected_draining"] > 0


def test_events_are_validated():
    reqs = [{"name": "a", "prompt_len": 1, "output_len": 1}]
    with pytest.raises(orcasim.ScenarioError, match=r"events\.0\.type"):
        run(reqs, [{"type": "pause", "at": 1}])
    with pytest.raises(orcasim.ScenarioError, match=r"events\.0\.at"):
        run(reqs, [{"type": "drain", "at": -1}])


def test_a_policy_that_loses_a_request_is_caught():
    from orcasim.policies.continuous import Continuous
    from orcasim.registry import policies

    @policies.register("test-loses-requests")
    class Loses(Continuous):
        """Drops the third request on the floor (tests only)."""

        def admit(self):
            for req in list(self.ctx.waiting):
                if req.id == 2:
                    self.ctx.waiting.remove(req)
            super().admit()

    sc = orcasim.load_scenario().override({"policy": {"type": "test-loses-requests"},
                                           "variants": None, "workload.num_requests": 5})
    with pytest.raises(orcasim.SimulationError, match=r"5 requests arrived but 4 finished"):
        orcasim.simulate(sc)

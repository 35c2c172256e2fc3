"""Clients that give up: patience and timeouts abort a request where it is and free it."""

from __future__ import annotations

import pytest

import orcasim

UNIT = {"type": "constant", "step_time": 1.0}


def run(requests, policy, **extra):
    sc = orcasim.Scenario({"workload": {"type": "list", "requests": requests},
                           "engine": {"latency": UNIT}, "policy": policy, **extra})
    return next(iter(orcasim.simulate(sc, trace_steps=True).values()))


def col(v, name):
    return v.requests.set_index("name")[name].to_dict()


@pytest.mark.parametrize("policy", ["fcfs", "continuous", "vllm-v1", "priority"])
def test_a_waiting_client_gives_up_after_its_patience(policy):
    reqs = [{"name": "a", "prompt_len": 1, "output_len": 5},
            {"name": "b", "prompt_len": 1, "output_len": 1, "patience": 2.0},
            {"name": "c", "prompt_len": 1, "output_len": 1, "patience": 10.0}]
    v = run(reqs, {"type": policy, "max_num_seqs": 1})
    # one slot: a runs 0-5; b gives up waiting at t = 2; c starts at 5 and finishes
    assert col(v, "state") == {"a": "finished", "b": "aborted", "c": "finished"}
    assert col(v, "reason")["b"] == "client_timeout" and col(v, "finish")["b"] == 2.0
    assert col(v, "first_scheduled")["c"] == 5.0
    assert v.summary["aborted_client_timeout"] == 1


def test_a_timeout_frees_the_slot_and_the_memory_at_once():
    reqs = [{"name": "a", "prompt_len": 8, "output_len": 6, "timeout": 2.5},
            {"name": "b", "arrival": 0.5, "prompt_len": 10, "output_len": 2}]
    v = run(reqs, {"type": "fcfs", "max_batch": 4}, memory={"num_blocks": 8, "block_size": 2})
    # a holds 4 then 5 of the 8 blocks; b's 10-token prompt needs 5: it waits until a's
    # client gives up at 2.5, in the middle of step 3, whose part for a is lost
    assert v.format_steps().splitlines() == ["step 1: a", "step 2: a", "step 3: a",
                                             "step 4: b", "step 5: b"]
    assert col(v, "state") == {"a": "aborted", "b": "finished"}
    assert col(v, "finish") == {"a": 2.5, "b": 5.0}
    assert col(v, "num_output_tokens")["a"] == 2  # steps 1 and 2; step 3's token is lost
    assert col(v, "first_scheduled")["b"] == 3.0


def test_clients_section_applies_to_every_request_and_preempted_ones_too():
    reqs = [{"name": f"r{i}", "arrival": 0.1 * i, "prompt_len": 6, "output_len": 8,
             "priority": i % 2} for i in range(12)]
    base = {"workload": {"type": "list", "requests": reqs},
            "engine": {"latency": UNIT},
            "policy": {"type": "priority", "max_batch": 3, "preempt": True},
            "memory": {"num_blocks": 12, "block_size": 2}}
    v = next(iter(orcasim.simulate(orcasim.Scenario(
        {**base, "clients": {"patience": 6.0, "timeout": 12.0}})).values()))
    s = v.summary
    assert s["aborted_client_timeout"] > 0 and s["num_preemptions"] > 0
    assert s["num_finished"] + s["aborted_client_timeout"] == 12
    aborted = v.requests[v.requests["state"] == "aborted"]
    late = aborted["finish"] - aborted["arrival"]
    assert ((late == 6.0) | (late == 12.0)).all()  # at a limit, never between
    # nothing gives up without the section
    v = next(iter(orcasim.simulate(orcasim.Scenario(base)).values()))
    assert v.summary["num_finished"] == 12

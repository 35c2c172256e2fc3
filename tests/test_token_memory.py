"""Token-level policies under a KV memory limit: hand-checked schedules.

Every step takes 1 s, blocks hold 2 tokens and the pool has 5 blocks (10
slots) unless a test says otherwise. A scheduled request holds
ceil((computed + scheduled tokens) / 2) blocks.
"""

from __future__ import annotations

import pytest

import orcasim

ABC = [
    {"name": "A", "prompt_len": 3, "output_len": 4},
    {"name": "B", "prompt_len": 3, "output_len": 4},
    {"name": "C", "prompt_len": 2, "output_len": 2},
]


def run(requests=ABC, policy=None, memory=None, **top):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": {"type": "constant", "step_time": 1.0}},
        "policy": {"type": "fcfs", "max_batch": 8, **(policy or {})},
        "memory": {"block_size": 2, "num_blocks": 5, **(memory or {})},
        **top,
    })
    return next(iter(orcasim.simulate(sc, trace_steps=True).values()))


def col(v, name):
    return v.requests.set_index("name")[name].to_dict()


def test_fcfs_preempts_the_last_admitted_by_recompute():
    v = run()
    # step 1: A, B, C prefill (2 + 2 + 1 blocks). Step 2: C's next token needs a 2nd block,
    # none is free: C, the last admitted, preempts itself; no admission after a preemption.
    # Step 3: A takes the free block, B then preempts itself. Step 4: B needs 3 blocks for
    # its 5 tokens, 2 are free: it waits. A finishes at 4; B and C come back together.
    assert v.format_steps().splitlines() == [
        "step 1: A | B | C",
        "step 2: A | B",
        "step 3: A",
        "step 4: A",
        "step 5: B | C",
        "step 6: B",
    ]
    assert col(v, "finish") == {"A": 4.0, "B": 6.0, "C": 5.0}
    assert col(v, "num_preemptions") == {"A": 0, "B": 1, "C": 1}
    s = v.summary
    assert (s["num_preemptions"], s["num_preemptions_kv_full"]) == (2, 2)
    assert s["num_recomputed_tokens"] == 4 + 2  # B: prompt and 1st token; C: its prompt
    assert s["kv_peak_usage"] == 1.0
    # the continuous (decode-only) policy preempts the same requests at the same times
    cont = run(policy={"type": "continuous"})
    assert cont.summary["num_preemptions"] == 2 and col(cont, "finish") == col(v, "finish")
    assert cont.summary["num_recomputed_tokens"] == s["num_recomputed_tokens"]


def test_a_chunked_prompt_takes_blocks_chunk_by_chunk():
    # a 7-token prompt in chunks of 2: 1, 2, 3, then 4 blocks; the 5th step decodes
    v = run([{"name": "L", "prompt_len": 7, "output_len": 2}],
            policy={"token_budget": 2}, memory={"num_blocks": 4})
    assert v.format_steps().splitlines() == ["step 1: L", "step 2: L", "step 3: L",
                                             "step 4: L", "step 5: L"]
    assert col(v, "first_token") == {"L": 4.0} and col(v, "finish") == {"L": 5.0}
    # prompt 7 + output 2 - 1 = 8 tokens = 4 blocks: exactly the pool
    assert v.summary["kv_peak_usage"] == 1.0


def test_requests_that_can_never_fit_are_rejected():
    reqs = [{"name": "fits", "prompt_len": 4, "output_len": 7},
            {"name": "too_big", "prompt_len": 4, "output_len": 8}]
    v = run(reqs)
    # 4 + 7 - 1 = 10 slots fill the pool; 4 + 8 - 1 = 11 never fit, even alone
    assert col(v, "state") == {"fits": "finished", "too_big": "rejected"}
    assert col(v, "reason")["too_big"] == "exceeds_kv_capacity"
    v = run(reqs, memory={"max_model_len": 10})
    assert col(v, "reason")["too_big"] == "exceeds_max_model_len"


def test_priority_preempts_a_lower_class_for_memory():
    reqs = [{"name": "batch", "prompt_len": 6, "output_len": 4, "cls": "batch"},
            {"name": "inter", "arrival": 1.5, "prompt_len": 4, "output_len": 2,
             "cls": "interactive"}]
    policy = {"type": "priority", "classes": {"interactive": 0, "batch": 1}}
    # without preemption, inter waits for batch's 4 blocks (6 + 3 tokens) to be freed
    v = run(reqs, policy=policy)
    assert col(v, "first_scheduled") == {"batch": 0.0, "inter": 4.0}
    # with preemption, inter takes batch's memory at the next step boundary
    v = run(reqs, policy={**policy, "preempt": True})
    # (batch then recomputes its 6 + 2 tokens in one step, emitting its 3rd token)
    assert v.format_steps().splitlines() == ["step 1: batch", "step 2: batch", "step 3: inter",
                                             "step 4: inter", "step 5: batch", "step 6: batch"]
    assert col(v, "first_scheduled") == {"batch": 0.0, "inter": 2.0}
    s = v.summary
    assert (s["num_preemptions_priority"], s["num_recomputed_tokens"]) == (1, 7)
    assert col(v, "finish") == {"inter": 4.0, "batch": 6.0}


def test_swap_preemption_for_a_token_policy_is_engine_time():
    # a block is 2 tokens x 1000 bytes; PCIe at 4000 B/s: 0.5 s per block each way
    v = run(policy={"preemption": "swap"},
            memory={"bytes_per_token": 1000, "pcie_bandwidth": 4000})
    t = v.step_table
    assert list(zip(t["t_start"], t["t_end"], t["slots"], strict=True)) == [
        (0.0, 1.0, "A | B | C"),
        (1.0, 2.5, "A | B"),  # C (1 block) swapped out: 0.5 s
        (2.5, 4.5, "A"),  # B (2 blocks) swapped out: 1 s; nothing comes back in this step
        (4.5, 6.0, "A | C"),  # C back in (0.5 s, first come first served); B needs 3 of 0
        (6.0, 8.0, "B"),  # B back in: 1 s
        (8.0, 9.0, "B"),
    ]
    s = v.summary
    assert (s["num_preemptions"], s["num_swap_outs"], s["num_recomputed_tokens"]) == (2, 2, 0)
    assert s["swap_time_s"] == 3.0 and s["busy_fraction"] == 1.0
    assert col(v, "finish") == {"A": 6.0, "B": 9.0, "C": 6.0}


@pytest.mark.parametrize("allocator", ["max", "pow2", "oracle"])
def test_reservation_allocators_serve_token_policies(allocator):
    # a reservation covers the request's life: nothing grows, nothing is preempted
    v = run(policy={"type": "sarathi", "token_budget": 4},
            memory={"allocator": allocator, "max_model_len": 10, "num_blocks": 10})
    s = v.summary
    assert s["num_finished"] == 3 and s["num_preemptions"] == 0
    assert s["kv_peak_usage"] <= 1.0

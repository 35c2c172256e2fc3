"""The continuous policy under a KV memory limit: hand-checked schedules.

Unless a test says otherwise: every step takes 1 s, blocks hold 2 tokens and
the pool has 5 blocks (10 slots). A request with prompt P and k generated
tokens needs ceil((P + k) / 2) blocks to run its next step.
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.metrics.stats import weighted_percentiles

ABC = [
    {"name": "A", "prompt_len": 3, "output_len": 4},
    {"name": "B", "prompt_len": 3, "output_len": 4},
    {"name": "C", "prompt_len": 2, "output_len": 2},
]


def run(requests=ABC, policy=None, memory=None, **top):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": {"type": "constant", "step_time": 1.0}},
        "policy": {"type": "continuous", "max_batch": 8, **(policy or {})},
        "memory": {"block_size": 2, "num_blocks": 5, **(memory or {})},
        **top,
    })
    return orcasim.simulate(sc, trace_steps=True)["continuous"]


def col(v, name):
    return v.requests.set_index("name")[name].to_dict()


def itl_values(v):
    gaps, counts = v.itl
    return sorted(np.repeat(gaps, counts).tolist())


def test_recompute_preemption_head_of_line():
    v = run()
    # step 1: A, B, C take 2 + 2 + 1 blocks. Round 2: C needs a 2nd block, none is free: C is
    # the last admitted, so it preempts itself and waits (2 blocks > 1 free). Round 3: A takes
    # the free block, B needs one and preempts itself; B needs 3 > 2 free; C waits behind B.
    assert v.format_steps().splitlines() == [
        "step 1: A | B | C",
        "step 2: A | B | empty",
        "step 3: A | empty | empty",
        "step 4: A | empty | empty",
        "step 5: B | C | empty",
        "step 6: B | empty | empty",
    ]
    assert col(v, "finish") == {"A": 4.0, "B": 6.0, "C": 5.0}
    assert col(v, "num_preemptions") == {"A": 0, "B": 1, "C": 1}
    s = v.summary
    assert s["num_preemptions"] == 2
    # the KV they lose: B its prompt and 1st token, C its prompt
    assert s["num_recomputed_tokens"] == (3 + 1) + 2
    # tokens: A at 1,2,3,4; B at 1,2 then 5,6; C at 1 then 5
    assert itl_values(v) == [1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 4.0]
    assert s["itl_p50"] == weighted_percentiles(*v.itl, (50,))[0] == 1.0
    assert s["kv_peak_usage"] == 1.0


def test_skip_admits_a_smaller_request_behind_a_blocked_one():
    v = run(policy={"kv_admission": "skip"})
    # round 3: B (3 blocks) does not fit in the 2 free blocks, C (2 blocks) behind it does
    assert v.format_steps().splitlines() == [
        "step 1: A | B | C",
        "step 2: A | B | empty",
        "step 3: A | C | empty",
        "step 4: A | empty | empty",
        "step 5: B | empty | empty",
        "step 6: B | empty | empty",
    ]
    assert col(v, "finish") == {"A": 4.0, "B": 6.0, "C": 3.0}


def test_swap_preemption_timeline():
    # a block is 2 tokens x 1000 bytes; PCIe at 4000 B/s: 0.5 s per block each way
    v = run(policy={"preemption": "swap"},
            memory={"bytes_per_token": 1000, "pcie_bandwidth": 4000})
    t = v.step_table
    # the swap copies are engine time inside the step that swaps
    assert list(zip(t["t_start"], t["t_end"], t["slots"], strict=True)) == [
        (0.0, 1.0, "A | B | C"),
        (1.0, 2.5, "A | B | empty"),  # C (1 block) swapped out: 0.5 s
        (2.5, 5.0, "A | C | empty"),  # B (2 blocks) out: 1 s; C back in: 0.5 s
        (5.0, 6.0, "A | empty | empty"),  # B needs 3 blocks, 2 are free
        (6.0, 8.0, "B | empty | empty"),  # B back in: 1 s
        (8.0, 9.0, "B | empty | empty"),
    ]
    assert v.summary["busy_fraction"] == 1.0
    assert col(v, "finish") == {"A": 6.0, "B": 9.0, "C": 5.0}
    s = v.summary
    assert (s["num_preemptions"], s["num_swap_outs"], s["num_recomputed_tokens"]) == (2, 2, 0)
    assert s["swapped_bytes"] == 2 * (2000 + 4000) and s["swap_time_s"] == 3.0
    # A: 1, 2.5, 5, 6; B: 1, 2.5, 8, 9; C: 1, 5
    assert itl_values(v) == [1.0, 1.0, 1.5, 1.5, 2.5, 4.0, 5.5]


def test_swap_falls_back_to_recompute_when_the_swap_space_is_full():
    # room for 2 CPU blocks: C (1 block) is swapped, B (2 more) must recompute
    v = run(policy={"preemption": "swap"},
            memory={"bytes_per_token": 1000, "pcie_bandwidth": 4000, "swap_space_gb": 4e-6})
    s = v.summary
    assert (s["num_preemptions"], s["num_swap_outs"]) == (2, 1)
    assert s["num_recomputed_tokens"] == 3 + 1  # B loses its prompt and 1st token
    assert (v.requests["state"] == "finished").all()


@pytest.mark.parametrize("preemption,extra,tokens", [
    ("recompute", {}, {"A": 3, "B": 2, "C": 1}),
    ("swap", {"bytes_per_token": 1000, "pcie_bandwidth": 4000}, {"A": 2, "B": 2, "C": 1}),
])
def test_hard_stop_aborts_running_and_swapped_requests(preemption, extra, tokens):
    # stop at t=3.2. Recompute: A is in its 4th step, B and C wait. Swap: the engine is
    # copying (2.5 to 4.0 s): B is in the swap space and C on its way back in
    v = run(policy={"preemption": preemption}, memory=extra,
            events=[{"type": "hard_stop", "at": 3.2}])
    assert col(v, "state") == {"A": "aborted", "B": "aborted", "C": "aborted"}
    assert col(v, "reason") == {"A": "hard_stop", "B": "hard_stop", "C": "hard_stop"}
    assert col(v, "num_output_tokens") == tokens


def test_lowest_priority_victim():
    reqs = [dict(r, priority=p) for r, p in zip(ABC, (0, 5, 1), strict=True)]
    v = run(reqs, policy={"victim": "lowest_priority"})
    # round 2: C needs a block; B (priority 5) is preempted instead of C
    assert v.format_steps().splitlines()[:3] == [
        "step 1: A | B | C",
        "step 2: A | empty | C",
        "step 3: A | B | empty",
    ]
    assert col(v, "num_preemptions") == {"A": 0, "B": 2, "C": 0}
    assert col(v, "finish") == {"A": 4.0, "B": 6.0, "C": 2.0}


def test_watermark_keeps_blocks_free_at_admission():
    v = run(policy={"watermark": 0.2})  # keep 1 of 5 blocks free, unless the batch is empty
    assert v.format_steps().splitlines() == [
        "step 1: A | B",  # C (1 block) would leave no block free
        "step 2: A | B",
        "step 3: A | empty",  # B preempted itself and needs 3 blocks, 2 are free
        "step 4: A | empty",
        "step 5: B | C",  # the batch was empty: B may take the last free blocks
        "step 6: B | C",
    ]
    assert col(v, "finish") == {"A": 4.0, "B": 6.0, "C": 6.0}
    assert v.summary["num_preemptions"] == 1


def test_prompt_larger_than_the_pool_is_rejected_and_the_run_goes_on():
    v = run([{"name": "X", "prompt_len": 11, "output_len": 1},  # 6 blocks > 5
             {"name": "Y", "prompt_len": 2, "output_len": 2}])
    assert col(v, "state") == {"X": "rejected", "Y": "finished"}
    assert v.columns["reason"] == ["exceeds_kv_capacity", None]
    assert col(v, "finish")["Y"] == 2.0
    assert v.summary["num_rejected"] == 1


def test_sequence_longer_than_max_model_len_is_rejected():
    v = run([{"name": "X", "prompt_len": 5, "output_len": 4},
             {"name": "Y", "prompt_len": 2, "output_len": 2}], memory={"max_model_len": 8})
    assert v.columns["reason"] == ["exceeds_max_model_len", None]


@pytest.mark.parametrize("preemption,extra", [("recompute", {}),
                                              ("swap", {"bytes_per_token": 1000})])
def test_a_sequence_that_outgrows_the_pool_is_a_preemption_loop(preemption, extra):
    # 3 + 10 - 1 = 12 slots > 10: after 8 tokens it needs a 6th block and is alone
    with pytest.raises(orcasim.SimulationError,
                       match=r"preemption loop at t=8: request A was preempted with 3 prompt \+ "
                             r"8 generated tokens, which need 6 KV blocks of 2 tokens, but the "
                             r"pool has 5"):
        run([{"name": "A", "prompt_len": 3, "output_len": 10}],
            policy={"preemption": preemption}, memory=extra)


def test_reservation_allocators_hold_memory_for_the_whole_request():
    # oracle reserves P + o - 1 slots: A 6, B 6, C 3. B does not fit next to A.
    v = run(memory={"allocator": "oracle"})
    assert col(v, "first_scheduled") == {"A": 0.0, "B": 4.0, "C": 4.0}
    assert col(v, "finish") == {"A": 4.0, "B": 8.0, "C": 6.0}
    v = run(memory={"allocator": "oracle"}, policy={"kv_admission": "skip"})
    assert col(v, "first_scheduled") == {"A": 0.0, "B": 4.0, "C": 0.0}
    # max reserves max_model_len = 8 slots: one request at a time
    v = run(memory={"allocator": "max", "max_model_len": 8})
    assert col(v, "first_scheduled") == {"A": 0.0, "B": 4.0, "C": 8.0}
    assert v.summary["num_preemptions"] == 0


def test_external_fragmentation_and_time_averaged_shares():
    # oracle: A 3 slots at [0,3), B 4 at [3,7), C 3 at [7,10). A and C finish at t=2, leaving
    # 6 free slots in two holes of 3: D (5 slots) waits for B although 6 >= 5.
    v = run([{"name": "A", "prompt_len": 2, "output_len": 2},
             {"name": "B", "prompt_len": 1, "output_len": 4},
             {"name": "C", "prompt_len": 2, "output_len": 2},
             {"name": "D", "prompt_len": 3, "output_len": 3}], memory={"allocator": "oracle"})
    assert col(v, "first_scheduled")["D"] == 4.0 and col(v, "finish")["D"] == 7.0
    s = v.summary
    # per step (1 s each): tokens 5, 8, 3, 4, 3, 4, 5; allocated 10, 10, 4, 4, 5, 5, 5;
    # stranded free 0, 0, 6, 6, 0, 0, 0 (D waits at steps 1-4, nothing is free at 1-2)
    assert s["kv_token_share"] == pytest.approx(32 / 70)
    assert s["kv_reserved_share"] == pytest.approx(11 / 70)
    assert s["kv_internal_frag_share"] == 0.0
    assert s["kv_external_frag_share"] == pytest.approx(12 / 70)
    assert s["kv_free_share"] == pytest.approx(15 / 70)
    assert s["kv_used_token_share"] == pytest.approx(32 / 55)
    assert s["kv_alloc_waste"] == pytest.approx(11 / 43)
    u = v.kv_usage
    assert u["tokens"].tolist() == [5, 8, 3, 4, 3, 4, 5]
    assert u["stranded"].tolist() == [0, 0, 6, 6, 0, 0, 0]


def test_buddy_padding_counts_as_external_fragmentation():
    # oracle + buddy: A's 6 slots take an 8-chunk (2 padding); 10 slots = chunks 8 + 2
    v = run([{"name": "A", "prompt_len": 3, "output_len": 4},
             {"name": "C", "prompt_len": 2, "output_len": 2}],
            memory={"allocator": "oracle", "placement": "buddy"})
    # C (3 slots -> a 4-chunk) fits in neither the 2 left nor next to A: it waits for A
    assert col(v, "first_scheduled") == {"A": 0.0, "C": 4.0}
    u = v.kv_usage
    assert u["allocated"].tolist() == [8, 8, 8, 8, 4, 4]
    assert u["padding"].tolist() == [2, 2, 2, 2, 1, 1]
    assert u["stranded"].tolist() == [2, 2, 2, 2, 0, 0]
    s = v.summary
    assert s["kv_external_frag_share"] == pytest.approx((4 * (2 + 2) + 2 * 1) / 60)


def test_paged_internal_fragmentation_is_the_last_block_tail():
    # one request, prompt 3, output 3: footprint 5 slots in 3 blocks of 2 (1 slot never used)
    v = run([{"name": "A", "prompt_len": 3, "output_len": 3}])
    u = v.kv_usage
    assert u["tokens"].tolist() == [3, 4, 5]
    assert u["allocated"].tolist() == [4, 4, 6]
    assert u["internal"].tolist() == [0, 0, 1]  # from the step that takes the final block
    s = v.summary
    assert s["kv_alloc_waste"] == pytest.approx((1 + 0 + 1) / 14)


def test_memory_that_never_binds_gives_the_unlimited_results():
    sc = orcasim.load_scenario().override({"workload.num_requests": 300, "variants": None})
    free = orcasim.simulate(sc)["continuous"]
    paged = orcasim.simulate(sc.override({"memory": {"num_blocks": 100_000}}))["continuous"]
    for c in ("first_scheduled", "first_token", "finish"):
        assert np.array_equal(free.columns[c], paged.columns[c])
    for k in ("e2e_p99", "itl_p99", "tpot_p50", "throughput_tok_s", "num_steps"):
        assert free.summary[k] == paged.summary[k]
    assert paged.summary["num_preemptions"] == 0

"""Token-level policies: exact schedules on small hand-checked workloads."""

from __future__ import annotations

import numpy as np
import pytest

import orcasim


def run(requests, policy, latency=None, **extra):
    """Run ``requests`` under ``policy``; steps cost 1 s + 0.25 s per prefill token by default."""
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": latency or {"type": "linear", "base": 1.0, "per_seq": 0.0,
                                          "per_token": 0.0, "per_prefill_token": 0.25}},
        "policy": policy,
        **extra,
    })
    return next(iter(orcasim.simulate(sc, trace_steps=True).values()))


def by_name(v, col):
    return v.requests.set_index("name")[col].to_dict()


UNIT = {"type": "constant", "step_time": 1.0}


def test_sarathi_decodes_first_and_chunks_prompts_into_the_budget():
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 1, "output_len": 4},
            {"name": "B", "arrival": 0.5, "prompt_len": 8, "output_len": 1}]
    v = run(reqs, {"type": "sarathi", "token_budget": 4})
    # step 1: A's prompt (1.25 s); then A decodes 1 token while B's prompt runs in
    # chunks of 3, 3, 2 that fill the rest of the budget: 1.75 s, 1.75 s, 1.5 s
    assert v.format_steps().splitlines() == ["step 1: A", "step 2: A | B", "step 3: A | B",
                                             "step 4: A | B"]
    assert by_name(v, "first_token") == {"A": 1.25, "B": 6.25}
    assert by_name(v, "finish") == {"A": 6.25, "B": 6.25}
    assert v.summary["itl_p50"] == 1.75


def test_whole_prompts_stall_decodes_chunks_do_not():
    # A decodes while B's 40-token prompt arrives: without chunking B's prompt runs in
    # one 11 s step and A's next token waits for it; sarathi spreads it over 5 steps
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 1, "output_len": 8},
            {"name": "B", "arrival": 0.5, "prompt_len": 40, "output_len": 1}]
    whole = run(reqs, {"type": "fcfs", "token_budget": 64, "chunked_prefill": False})
    chunks = run(reqs, {"type": "sarathi", "token_budget": 9})
    assert max(whole.itl[0]) == 11.0  # 1 s + 40 x 0.25 s
    assert max(chunks.itl[0]) == 3.0  # 1 s + 8 x 0.25 s
    assert by_name(whole, "first_token")["B"] == 12.25
    assert by_name(chunks, "first_token")["B"] == 1.25 + 3.0 * 5


def test_fcfs_without_chunking_blocks_at_the_head_and_rejects_oversized_prompts():
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 1, "output_len": 4},
            {"name": "B", "arrival": 0.5, "prompt_len": 8, "output_len": 1},
            {"name": "C", "arrival": 0.5, "prompt_len": 20, "output_len": 1}]
    v = run(reqs, {"type": "fcfs", "token_budget": 8, "chunked_prefill": False})
    # B's 8 tokens do not fit next to A's decode: it waits until A is done (t = 4.25)
    assert v.format_steps().splitlines() == ["step 1: A", "step 2: A", "step 3: A",
                                             "step 4: A", "step 5: B"]
    assert by_name(v, "first_token")["B"] == 4.25 + 3.0
    assert by_name(v, "state")["C"] == "rejected" and by_name(v, "reason")["C"] == \
        "prompt_too_long"
    assert v.summary["rejected_prompt_too_long"] == 1


def test_prefill_first_runs_new_prompts_alone():
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 2, "output_len": 3},
            {"name": "B", "arrival": 0.5, "prompt_len": 4, "output_len": 2}]
    v = run(reqs, {"type": "prefill-first"})
    assert v.format_steps().splitlines() == ["step 1: A", "step 2: B", "step 3: A | B",
                                             "step 4: A"]
    assert by_name(v, "first_token") == {"A": 1.5, "B": 3.5}
    assert by_name(v, "finish") == {"A": 5.5, "B": 4.5}
    # A's second token waited for B's prompt step: a 3 s gap
    assert sorted(v.itl[0][v.itl[1] > 0].tolist()) == [1.0, 1.0, 3.0]


def test_decode_first_waits_for_the_batch_to_drain():
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 2, "output_len": 3},
            {"name": "B", "arrival": 0.5, "prompt_len": 4, "output_len": 2}]
    v = run(reqs, {"type": "decode-first"})
    assert v.format_steps().splitlines() == ["step 1: A", "step 2: A", "step 3: A",
                                             "step 4: B", "step 5: B"]
    assert by_name(v, "first_token") == {"A": 1.5, "B": 5.5}
    assert by_name(v, "finish") == {"A": 3.5, "B": 6.5}
    # refill_below: 1 lets B in as soon as one request is left
    v = run(reqs, {"type": "decode-first", "refill_below": 1})
    assert v.format_steps().splitlines()[:2] == ["step 1: A", "step 2: B"]


CLASSES = {"interactive": 0, "batch": 1}
PRIO_REQS = [{"name": "L", "arrival": 0, "prompt_len": 1, "output_len": 3, "cls": "batch"},
             {"name": "M", "arrival": 0.2, "prompt_len": 1, "output_len": 1, "cls": "batch"},
             {"name": "H", "arrival": 0.5, "prompt_len": 1, "output_len": 1,
              "cls": "interactive"}]


def test_strict_priority_without_and_with_preemption():
    v = run(PRIO_REQS, {"type": "priority", "max_batch": 1, "classes": CLASSES}, latency=UNIT)
    assert v.format_steps().splitlines() == ["step 1: L", "step 2: L", "step 3: L",
                                             "step 4: H", "step 5: M"]
    v = run(PRIO_REQS, {"type": "priority", "max_batch": 1, "classes": CLASSES,
                        "preempt": True}, latency=UNIT)
    # H preempts L at t = 1; L recomputes prompt + 1 token (emitting its 2nd) at step 3
    assert v.format_steps().splitlines() == ["step 1: L", "step 2: H", "step 3: L",
                                             "step 4: L", "step 5: M"]
    df = v.requests.set_index("name")
    assert df["num_preemptions"].to_dict() == {"L": 1, "M": 0, "H": 0}
    assert df["finish"].to_dict() == {"L": 4.0, "M": 5.0, "H": 2.0}
    assert df.loc["L", "num_output_tokens"] == 3


def test_aging_lets_a_long_waiting_low_class_go_first():
    reqs = [dict(r) for r in PRIO_REQS]
    reqs[2]["arrival"] = 0.75  # H arrives 0.55 s after M
    strict = run(reqs, {"type": "priority", "max_batch": 1, "classes": CLASSES}, latency=UNIT)
    aged = run(reqs, {"type": "priority", "max_batch": 1, "classes": CLASSES, "aging_s": 0.5},
               latency=UNIT)
    assert strict.format_steps().splitlines()[3:] == ["step 4: H", "step 5: M"]
    # M ranks as if it arrived at 0.2 + 0.5 = 0.7 < 0.75: it has waited long enough
    assert aged.format_steps().splitlines()[3:] == ["step 4: M", "step 5: H"]


def test_an_unknown_class_is_a_clear_error():
    reqs = [{"name": "X", "prompt_len": 1, "output_len": 1, "cls": "bulk"}]
    with pytest.raises(orcasim.SimulationError, match=r"class 'bulk'.*policy.classes"):
        run(reqs, {"type": "priority", "classes": CLASSES})


def test_vtc_alternates_between_tenants():
    reqs = [{"name": f"a{i}", "prompt_len": 1, "output_len": 1, "tenant": "a"} for i in range(4)]
    reqs += [{"name": f"b{i}", "prompt_len": 1, "output_len": 1, "tenant": "b"} for i in range(2)]
    v = run(reqs, {"type": "vtc", "max_batch": 1}, latency=UNIT)
    order = [line.split(": ")[1] for line in v.format_steps().splitlines()]
    assert order == ["a0", "b0", "a1", "b1", "a2", "a3"]
    fcfs = run(reqs, {"type": "fcfs", "max_batch": 1}, latency=UNIT)
    assert [line.split(": ")[1] for line in fcfs.format_steps().splitlines()] == [
        "a0", "a1", "a2", "a3", "b0", "b1"]
    assert v.summary["tenant.a.service_tokens"] == 8 and v.summary["jain_index"] == \
        pytest.approx(144 / (2 * (64 + 16)))


def test_class_share_weights():
    reqs = [{"name": f"i{k}", "prompt_len": 1, "output_len": 1, "cls": "interactive"}
            for k in range(4)]
    reqs += [{"name": f"b{k}", "prompt_len": 1, "output_len": 1, "cls": "batch"}
             for k in range(4)]
    v = run(reqs, {"type": "class-share", "max_batch": 1,
                   "weights": {"interactive": 3, "batch": 1}}, latency=UNIT)
    order = [line.split(": ")[1] for line in v.format_steps().splitlines()]
    # each request costs 2 (1 prompt + 1 output token); interactive pays 2/3 per request
    assert order == ["i0", "b0", "i1", "i2", "i3", "b1", "b2", "b3"]


def test_sjf_oracle_and_noisy_predictions():
    lens = [5, 2, 3, 9, 1]
    reqs = [{"name": f"r{k}", "prompt_len": 1, "output_len": n} for k, n in enumerate(lens)]
    v = run(reqs, {"type": "sjf", "max_batch": 1}, latency=UNIT)
    first = v.requests.sort_values("first_scheduled")["name"].tolist()
    assert first == ["r4", "r1", "r2", "r0", "r3"]
    sigma = 1.0
    noisy = run(reqs, {"type": "sjf", "max_batch": 1, "sigma": sigma}, latency=UNIT)
    # predictions come from the run's policy stream, drawn in arrival order
    rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(1,)))
    pred = [n * np.exp(sigma * rng.standard_normal()) for n in lens]
    expect = [f"r{k}" for k in np.argsort(pred, kind="stable")]
    assert noisy.requests.sort_values("first_scheduled")["name"].tolist() == expect
    assert expect != first  # the noise changed the order


def test_policy_randomness_does_not_touch_the_workload():
    sc = orcasim.load_scenario().override({"workload.num_requests": 50, "variants": {
        "fcfs": {"policy": {"type": "fcfs"}},
        "noisy": {"policy": {"type": "sjf", "sigma": 0.8}}}})
    res = orcasim.simulate(sc, seed=4)
    a, b = res["fcfs"].requests, res["noisy"].requests
    for col in ("arrival", "prompt_len", "output_len"):
        assert a[col].tolist() == b[col].tolist()
    again = orcasim.simulate(sc, seed=4)["noisy"].requests
    assert again["finish"].tolist() == b["finish"].tolist()


def test_srpt_preempts_the_longest_remaining():
    reqs = [{"name": "R0", "arrival": 0, "prompt_len": 1, "output_len": 6},
            {"name": "R1", "arrival": 0.5, "prompt_len": 1, "output_len": 2}]
    v = run(reqs, {"type": "srpt", "max_batch": 1}, latency=UNIT)
    assert v.format_steps().splitlines() == ["step 1: R0", "step 2: R1", "step 3: R1",
                                             *[f"step {k}: R0" for k in range(4, 9)]]
    df = v.requests.set_index("name")
    assert df["finish"].to_dict() == {"R0": 8.0, "R1": 3.0}
    assert df.loc["R0", "num_preemptions"] == 1
    # the resumed request recomputed 2 tokens and emitted its 2nd token 3 s after its 1st
    assert 3.0 in v.itl[0].tolist()


def test_edf_serves_the_earliest_deadline():
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 1, "output_len": 2, "deadline": 50},
            {"name": "B", "arrival": 0.1, "prompt_len": 1, "output_len": 1, "deadline": 30},
            {"name": "C", "arrival": 0.2, "prompt_len": 1, "output_len": 1, "deadline": 5},
            {"name": "D", "arrival": 0.3, "prompt_len": 1, "output_len": 1}]
    v = run(reqs, {"type": "edf", "max_batch": 1}, latency=UNIT)
    assert v.format_steps().splitlines() == ["step 1: A", "step 2: A", "step 3: C",
                                             "step 4: B", "step 5: D"]
    v = run(reqs, {"type": "edf", "max_batch": 1, "preempt": True, "default_deadline": 1},
            latency=UNIT)
    # D is due at 1.3, C at 5.2: both preempt A (due 50) in turn
    assert v.format_steps().splitlines()[:3] == ["step 1: A", "step 2: D", "step 3: C"]


@pytest.mark.parametrize("policy", ["fcfs", "sarathi", "prefill-first", "decode-first",
                                    "priority", "class-share", "vtc", "sjf", "srpt", "edf"])
def test_every_policy_finishes_every_request(policy):
    sc = orcasim.load_scenario().override({
        "workload.num_requests": 120, "workload.arrival.rate": 3.0,
        "workload.classes": [
            {"name": "interactive", "priority": 0, "tenant": "a", "deadline": 20.0},
            {"name": "batch", "priority": 1, "tenant": "b", "deadline": 20.0}],
        "engine.latency.per_prefill_token": 0.0001, "policy": {"type": policy},
        "variants": None})
    v = next(iter(orcasim.simulate(sc, seed=2).values()))
    df = v.requests
    assert (df["state"] == "finished").all()
    assert (df["num_output_tokens"] == df["output_len"]).all()
    assert v.summary["output_tokens"] == df["output_len"].sum()


def test_vtc_equalises_backlogged_tenants_and_jain_shows_it():
    # tenant a sends 4x the requests of b; both want more than the engine can give
    sc = orcasim.load_scenario().override({
        "workload.num_requests": 3000,
        "workload.classes": [{"name": "a", "weight": 0.8, "tenant": "a"},
                             {"name": "b", "weight": 0.2, "tenant": "b"}],
        "events": [{"type": "hard_stop", "at": 100}],
        "variants": {"fcfs": {"policy": {"type": "fcfs"}}, "vtc": {"policy": {"type": "vtc"}},
                     "vtc-b2": {"policy": {"type": "vtc", "weights": {"b": 2}}}}})
    s = orcasim.simulate(sc, seed=0).summary
    assert s["fcfs"]["jain_index"] < 0.8  # service follows demand, 3.2 : 1
    assert s["fcfs"]["tenant.a.service_tokens"] > 3 * s["fcfs"]["tenant.b.service_tokens"]
    assert s["vtc"]["jain_index"] > 0.999
    ratio = s["vtc-b2"]["tenant.b.service_tokens"] / s["vtc-b2"]["tenant.a.service_tokens"]
    assert 1.6 < ratio < 2.2  # weight 2: about twice the service

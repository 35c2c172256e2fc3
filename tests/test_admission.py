"""Admission control: each controller's rule, composition, and every rejection's reason."""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import pytest

import orcasim
from orcasim.admission.slo import SLOTTFT

UNIT = {"type": "constant", "step_time": 1.0}


def run(requests, admission, policy=None, **extra):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": UNIT},
        "policy": policy or {"type": "fcfs", "max_batch": 1},
        "admission": admission,
        **extra,
    })
    return next(iter(orcasim.simulate(sc).values()))


def states(v):
    df = v.requests.set_index("name")
    return {n: (s if s == "finished" else f"{s}:{r}")
            for n, s, r in zip(df.index, df["state"], df["reason"], strict=True)}


def test_max_queue():
    reqs = [{"name": f"r{k}", "prompt_len": 1, "output_len": 1} for k in range(5)]
    v = run(reqs, [{"type": "max_queue", "limit": 2}])
    # all five arrive at t = 0, before the engine admits any: the queue holds two
    assert states(v) == {"r0": "finished", "r1": "finished", "r2": "rejected:queue_full",
                         "r3": "rejected:queue_full", "r4": "rejected:queue_full"}
    assert v.summary["num_rejected"] == 3 and v.summary["rejected_queue_full"] == 3


def test_token_bucket_per_tenant():
    times = [0.0, 0.1, 0.2, 1.5, 3.0]
    reqs = [{"name": f"a{k}", "arrival": t, "prompt_len": 1, "output_len": 1, "tenant": "a"}
            for k, t in enumerate(times)]
    reqs += [{"name": "b0", "arrival": 0.2, "prompt_len": 1, "output_len": 1, "tenant": "b"}]
    v = run(reqs, [{"type": "token_bucket", "rate": 1.0, "burst": 2.0}],
            policy={"type": "fcfs", "max_batch": 8})
    # a: 2 tokens at t=0; a0, a1 take them; a2 finds 0.2; a3 finds 1.5; a4 finds 1.5 + 1.5 -> 2
    assert states(v) == {"a0": "finished", "a1": "finished", "a2": "rejected:rate_limited",
                         "a3": "finished", "a4": "finished", "b0": "finished"}
    # by prompt tokens, with a bigger bucket for tenant b
    reqs = [{"name": "a0", "prompt_len": 3, "output_len": 1, "tenant": "a"},
            {"name": "a1", "prompt_len": 3, "output_len": 1, "tenant": "a"},
            {"name": "b0", "prompt_len": 3, "output_len": 1, "tenant": "b"},
            {"name": "b1", "prompt_len": 3, "output_len": 1, "tenant": "b"}]
    v = run(reqs, [{"type": "token_bucket", "rate": 1.0, "burst": 4.0, "cost": "prompt_tokens",
                    "tenants": {"b": {"rate": 1.0, "burst": 6.0}}}],
            policy={"type": "fcfs", "max_batch": 8})
    assert states(v) == {"a0": "finished", "a1": "rejected:rate_limited", "b0": "finished",
                         "b1": "finished"}


def test_kv_fit_needs_a_memory_model():
    reqs = [{"name": "r0", "prompt_len": 1, "output_len": 1}]
    with pytest.raises(orcasim.ScenarioError, match="kv_fit needs a KV memory model"):
        run(reqs, [{"type": "kv_fit"}])


#: 10 blocks of 4 tokens; the hog holds 7 of them (25 + 3 tokens) from t = 0 to t = 5
HOG = {"name": "hog", "arrival": 0.0, "prompt_len": 25, "output_len": 4}


@pytest.mark.parametrize("policy", [
    {"type": "fcfs", "max_batch": 8},
    {"type": "continuous", "max_batch": 8},
    {"type": "priority", "max_batch": 8, "preempt": True},
])
def test_kv_fit_admits_only_prompts_that_fit(policy):
    memory = {"num_blocks": 10, "block_size": 4}
    reqs = [HOG,
            {"name": "fits", "arrival": 1.0, "prompt_len": 12, "output_len": 1},
            {"name": "too_big_now", "arrival": 1.0, "prompt_len": 13, "output_len": 1},
            {"name": "never_fits", "arrival": 1.0, "prompt_len": 41, "output_len": 1}]
    v = run(reqs, [{"type": "kv_fit"}], policy=policy, memory=memory)
    assert states(v) == {"hog": "finished", "fits": "finished",
                         "too_big_now": "rejected:kv_full",
                         "never_fits": "rejected:exceeds_kv_capacity"}
    # counting the queue: the 4-token prompt no longer fits behind the waiting 12-token one
    reqs = [HOG, {"name": "x", "arrival": 1.0, "prompt_len": 12, "output_len": 1},
            {"name": "y", "arrival": 1.0, "prompt_len": 4, "output_len": 1}]
    v = run(reqs, [{"type": "kv_fit", "include_waiting": True}], policy=policy, memory=memory)
    assert states(v) == {"hog": "finished", "x": "finished", "y": "rejected:kv_full"}


def test_kv_fit_on_a_reservation_pool_and_on_vllm_v1():
    # oracle reservations: the hog reserves 28 of 40 slots, so 3 whole blocks stay free
    reqs = [HOG, {"name": "fits", "arrival": 1.0, "prompt_len": 12, "output_len": 1},
            {"name": "too_big_now", "arrival": 1.0, "prompt_len": 13, "output_len": 1}]
    v = run(reqs, [{"type": "kv_fit"}], policy={"type": "fcfs", "max_batch": 8},
            memory={"num_blocks": 10, "block_size": 4, "allocator": "oracle"})
    assert states(v) == {"hog": "finished", "fits": "finished",
                         "too_big_now": "rejected:kv_full"}
    # vllm-v1's own pool (block 0 is its null block): 10 usable blocks of 4 tokens
    v = run(reqs, [{"type": "kv_fit"}],
            policy={"type": "vllm-v1", "num_blocks": 11, "block_size": 4,
                    "enable_prefix_caching": False})
    assert states(v) == {"hog": "finished", "fits": "finished",
                         "too_big_now": "rejected:kv_full"}


def test_slo_ttft_prediction():
    ctx = SimpleNamespace(now=0.0, num_started=0, waiting=deque())
    ctl = SLOTTFT(SLOTTFT.Params(ttft=4.0, base_s=0.5, window_s=10.0), ctx)
    req = orcasim.Request(0, 0.0, 10, 10)
    assert ctl.check(req) is None  # no history yet
    ctx.now, ctx.num_started, ctx.waiting = 10.0, 5, deque(range(6))
    # 5 starts in 10 s: 0.5 per s; 6 waiting -> 12 s + 0.5 s
    assert ctl.predicted_ttft() == 12.5
    assert ctl.check(req) == "slo_ttft"
    req.deadline = 20.0  # the request's own deadline wins over the default bound
    assert ctl.check(req) is None
    ctx.now, ctx.num_started = 25.0, 5  # nobody started during the last window
    assert ctl.predicted_ttft() == math.inf


def test_slo_ttft_in_a_run_keeps_admitted_requests_near_their_bound():
    reqs = [{"name": f"r{k}", "arrival": 0.5 * k, "prompt_len": 1, "output_len": 1,
             "deadline": 4.0} for k in range(60)]
    # arrivals at 2/s, service at 1/s: the queue grows until the controller caps it
    v = run(reqs, [{"type": "slo_ttft", "window_s": 5.0, "base_s": 1.0}])
    df = v.requests
    rejected = df[df["state"] == "rejected"]
    assert len(rejected) == 26 and set(rejected["reason"]) == {"slo_ttft"}
    done = df[df["state"] == "finished"]
    late = done[done["arrival"] >= 5.0]  # once the estimate exists
    # the estimate ignores the rest of the step in flight: at most one step (1 s) late
    assert late["ttft"].max() == 4.5
    none = run(reqs, [])
    assert none.requests["ttft"].max() == 30.5  # without it the last waits 30.5 s


def test_shed_drops_the_lowest_class_first():
    reqs = [{"name": "b1", "prompt_len": 1, "output_len": 1, "cls": "batch"},
            {"name": "b2", "prompt_len": 1, "output_len": 1, "cls": "batch"},
            {"name": "i1", "prompt_len": 1, "output_len": 1, "cls": "interactive"},
            {"name": "b3", "prompt_len": 1, "output_len": 1, "cls": "batch"}]
    v = run(reqs, [{"type": "shed", "limit": 2, "classes": {"interactive": 0, "batch": 1}}])
    assert states(v) == {"b1": "finished", "b2": "rejected:shed", "i1": "finished",
                         "b3": "rejected:shed"}
    assert v.summary["class.batch.num_rejected"] == 2
    assert v.summary["class.interactive.num_rejected"] == 0


def test_controllers_compose_in_order_and_commit_only_when_admitted():
    reqs = [{"name": f"r{k}", "prompt_len": 1, "output_len": 1} for k in range(4)]
    reqs += [{"name": f"r{k}", "arrival": k, "prompt_len": 1, "output_len": 1}
             for k in (5, 6, 7)]
    v = run(reqs, [{"type": "token_bucket", "rate": 0.001, "burst": 3.0},
                   {"type": "max_queue", "limit": 1}])
    # r1-r3 find the queue full: they take no token, so r5 and r6 still find one
    assert states(v) == {"r0": "finished", "r1": "rejected:queue_full",
                         "r2": "rejected:queue_full", "r3": "rejected:queue_full",
                         "r5": "finished", "r6": "finished", "r7": "rejected:rate_limited"}
    v = run(reqs[:4], [{"type": "max_queue", "limit": 3},
                       {"type": "token_bucket", "rate": 0.001, "burst": 2.0}])
    assert states(v) == {"r0": "finished", "r1": "finished", "r2": "rejected:rate_limited",
                         "r3": "rejected:rate_limited"}


def test_admission_works_with_decode_only_policies_and_validates():
    reqs = [{"name": f"r{k}", "prompt_len": 1, "output_len": 2} for k in range(4)]
    v = run(reqs, [{"type": "max_queue", "limit": 2}], policy={"type": "continuous",
                                                                "max_batch": 1})
    assert v.summary["rejected_queue_full"] == 2 and v.summary["num_finished"] == 2
    with pytest.raises(orcasim.ScenarioError, match=r"admission\.0\.limit: .*greater than or "
                       r"equal to 0"):
        run(reqs, [{"type": "max_queue", "limit": -1}])
    with pytest.raises(orcasim.ScenarioError, match=r"admission\.1\.type: unknown admission "
                       r"controller 'nope'"):
        run(reqs, [{"type": "max_queue", "limit": 1}, {"type": "nope"}])

"""The policy API: events a policy can wait on, the context, per-class summaries, labels."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

import orcasim
from orcasim.policies.base import PolicyParams, TokenPolicy
from orcasim.registry import policies

UNIT = {"type": "constant", "step_time": 1.0}


def scenario(requests, policy, **extra):
    return orcasim.Scenario({"workload": {"type": "list", "requests": requests},
                             "engine": {"latency": UNIT}, "policy": policy, **extra})


def hold_all_blocks_until(kv, t):
    """A helper process that takes the whole pool at t = 0 and gives it back at ``t``."""
    n = yield kv.get(kv.num_usable_blocks)
    yield kv.env.timeout(t)
    kv.put(n)


@policies.register("test-event-log")
class EventLog(TokenPolicy):
    """One request at a time, admitted only once memory is freed (tests only).

    A helper process logs every step end and slot freed; the policy logs
    what woke it.
    """

    class Params(PolicyParams):
        pass

    log: ClassVar[list] = []
    models_kv_memory = True

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        ctx.env.process(hold_all_blocks_until(ctx.kv, 2.5))
        ctx.env.process(self.watch())
        self.memory_ok = False

    def watch(self):
        ctx = self.ctx
        while ctx.now < 10.0:
            events = {"slot_freed": ctx.slot_freed, "step_end": ctx.step_end,
                      "timer": ctx.timer(10.0)}
            fired = yield events["slot_freed"] | events["step_end"] | events["timer"]
            EventLog.log.append((ctx.now, *[n for n, e in events.items() if e in fired]))

    def next_step(self):
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            if not self.running and ctx.waiting and self.memory_ok:
                req = ctx.waiting.popleft()
                ctx.admit(req)
                self.running.append(req)
            if self.running:
                r = self.running[0]
                return self.make_plan([(r, r.num_tokens - r.num_computed_tokens)])
            if not ctx.waiting and ctx.arrivals_done:
                return None
            freed = ctx.kv.freed
            woke = yield ctx.wake_event()
            if freed in woke:
                self.memory_ok = True
                EventLog.log.append((ctx.now, "memory freed"))


def test_a_policy_waits_on_memory_and_helpers_see_steps_and_slots():
    EventLog.log = []
    reqs = [{"name": "a", "arrival": 0, "prompt_len": 1, "output_len": 2},
            {"name": "b", "arrival": 0, "prompt_len": 1, "output_len": 1}]
    v = next(iter(orcasim.simulate(scenario(reqs, "test-event-log",
                                            memory={"num_blocks": 4})).values()))
    # nothing runs until memory is freed at 2.5; then a (2 steps) and b (1 step)
    assert v.requests.set_index("name")["first_scheduled"].to_dict() == {"a": 2.5, "b": 4.5}
    assert v.requests.set_index("name")["finish"].to_dict() == {"a": 4.5, "b": 5.5}
    assert EventLog.log == [
        (2.5, "memory freed"),
        (3.5, "step_end"),
        (4.5, "slot_freed", "step_end"),
        (5.5, "slot_freed", "step_end"),
        (15.5, "timer"),
    ]


def test_wake_event_without_memory_model_is_the_arrival():
    reqs = [{"name": "a", "arrival": 3, "prompt_len": 0, "output_len": 1}]
    v = next(iter(orcasim.simulate(scenario(reqs, "fcfs")).values()))
    assert v.requests["first_scheduled"].tolist() == [3.0]


def test_context_rng_is_seeded_per_run_and_separate_from_the_workload():
    import simpy

    from orcasim.context import SchedulerContext
    from orcasim.metrics.recorder import Recorder

    a = SchedulerContext(simpy.Environment(), Recorder(), seed=7).rng.random(3)
    b = SchedulerContext(simpy.Environment(), Recorder(), seed=7).rng.random(3)
    w = np.random.default_rng(7).random(3)
    assert a.tolist() == b.tolist() and a.tolist() != w.tolist()


def test_per_class_summary_keys():
    reqs = [{"name": "i1", "arrival": 0, "prompt_len": 1, "output_len": 2, "cls": "interactive"},
            {"name": "b1", "arrival": 0, "prompt_len": 1, "output_len": 3, "cls": "batch"},
            {"name": "i2", "arrival": 1, "prompt_len": 1, "output_len": 1, "cls": "interactive"},
            {"name": "b2", "arrival": 9, "prompt_len": 1, "output_len": 1, "cls": "batch"}]
    sc = scenario(reqs, {"type": "priority", "max_batch": 1,
                         "classes": {"interactive": 0, "batch": 1}},
                  events=[{"type": "drain", "at": 8}])
    v = next(iter(orcasim.simulate(sc).values()))
    s = v.summary
    # i1 runs 0-2, i2 2-3, b1 3-6; b2 arrives after the drain
    assert s["class.interactive.num_finished"] == 2 and s["class.batch.num_finished"] == 1
    assert s["class.batch.num_rejected"] == 1 and s["rejected_draining"] == 1
    assert s["class.interactive.ttft_p50"] == 1.5  # ttfts 1 and 2
    assert s["class.interactive.queue_delay_mean"] == 0.5
    assert s["class.batch.ttft_p99"] == 4.0
    assert s["class.interactive.output_tokens"] == 3 and s["class.batch.output_tokens"] == 3
    assert s["class.batch.throughput_tok_s"] == 3 / 6.0
    assert "tenant.None.num_requests" not in s and "jain_index" not in s
    # without classes the summary has exactly the base keys
    plain = next(iter(orcasim.simulate(orcasim.load_scenario().override(
        {"workload.num_requests": 20}), variants=["continuous"]).values())).summary
    assert not [k for k in plain if k.startswith(("class.", "tenant.", "rejected_", "aborted_"))]

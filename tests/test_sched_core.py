"""The scheduling core: policies wait on any event, event-driven policies, batch slots."""

from __future__ import annotations

import pytest

import orcasim
from orcasim import PolicyParams, TokenPolicy, register_policy
from orcasim.errors import SimulationError
from orcasim.policies.base import slots_field
from orcasim.policies.memory import KVDecodePolicy, KVPolicyParams

UNIT = {"type": "constant", "step_time": 1.0}


def simulate(requests, policy, **extra):
    sc = orcasim.Scenario({"workload": {"type": "list", "requests": requests},
                           "engine": {"latency": UNIT}, "policy": policy, **extra})
    return next(iter(orcasim.simulate(sc, trace_steps=True).values()))


def col(v, name):
    return v.requests.set_index("name")[name].to_dict()


def req(name, arrival=0.0, prompt=1, output=1, **kw):
    return {"name": name, "arrival": arrival, "prompt_len": prompt, "output_len": output, **kw}


@register_policy("test-one-at-a-time")
class OneAtATime(TokenPolicy):
    """Admit a request, then wait until a slot frees before admitting the next (tests only)."""

    class Params(PolicyParams):
        wait_on: str = "slot_freed"

    def next_step(self):
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            if ctx.waiting and not self.running:
                r = ctx.waiting.popleft()
                ctx.admit(r)
                self.running.append(r)
            elif ctx.waiting:
                wait = self.params.wait_on
                if wait == "slot_freed":
                    yield ctx.slot_freed  # the engine keeps stepping the running request
                elif wait == "step_end":
                    yield ctx.step_end
                else:
                    yield ctx.timer(float(wait))
                continue
            if self.running:
                return self.continue_step()
            if ctx.arrivals_done:
                return None
            yield ctx.arrival


def test_a_policy_waits_on_slot_freed_while_the_fast_paths():
    v = simulate([req("a", output=3), req("b", output=2)], {"type": "test-one-at-a-time"})
    # a runs three steps alone; its slot frees at t = 3 and b starts in the very next step
    assert v.format_steps().splitlines() == ["step 1: a", "step 2: a", "step 3: a",
                                             "step 4: b", "step 5: b"]
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 3.0}
    assert col(v, "finish") == {"a": 3.0, "b": 5.0}


def test_a_policy_waits_on_step_end_and_on_a_timer():
    v = simulate([req("a", output=3), req("b", output=1)],
                 {"type": "test-one-at-a-time", "wait_on": "step_end"})
    # each step end resumes the decision; b waits until a has left the batch
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 3.0}
    # at t = 1 the decision sets a 1.5 s timer; it fires inside step 3 (2-3), and the
    # decision resumes at that step's end, when a has just finished
    v = simulate([req("a", output=3), req("b", output=1)],
                 {"type": "test-one-at-a-time", "wait_on": "1.5"})
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 3.0}
    assert col(v, "finish") == {"a": 3.0, "b": 4.0}
    # a timer of 5 s outlives a: the engine, with nothing to run, waits for it (t = 1 + 5)
    v = simulate([req("a", output=3), req("b", output=1)],
                 {"type": "test-one-at-a-time", "wait_on": "5"})
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 6.0}
    assert v.summary["num_steps"] == 4


@register_policy("test-stuck")
class Stuck(TokenPolicy):
    """Waits for a freed slot with nothing running: it can never fire (tests only)."""

    def next_step(self):
        yield self.ctx.slot_freed | self.ctx.timer(2.0)
        yield self.ctx.slot_freed


def test_a_stalled_policy_is_named_with_the_event_it_waits_on():
    with pytest.raises(SimulationError, match=r"policy 'test-stuck' cannot make progress "
                                              r"while it waits on ctx.slot_freed"):
        simulate([req("a")], {"type": "test-stuck"})


@register_policy("test-greedy")
class Greedy(TokenPolicy):
    """Event-driven: admit whenever a request arrives or a slot frees (tests only)."""

    class Params(PolicyParams):
        max_batch: int = slots_field(2)

    def processes(self):
        return [self.admit_loop()]

    def admit_loop(self):
        ctx = self.ctx
        while True:
            while ctx.waiting and ctx.slots.free:
                r = ctx.waiting.popleft()
                ctx.admit(r)
                self.running.append(r)
            yield ctx.arrival | ctx.slot_freed


def test_an_event_driven_policy_admits_from_its_own_process():
    reqs = [req("a", output=3), req("b", output=1), req("c", arrival=0.5, output=1),
            req("d", arrival=4.5, output=1)]
    v = simulate(reqs, {"type": "test-greedy"})
    # c arrives during step 1 with both slots taken; b's slot frees at t = 1 and c is
    # admitted in time for step 2; d arrives while the engine is idle and starts at once
    assert v.format_steps().splitlines() == ["step 1: a | b", "step 2: a | c", "step 3: a",
                                             "step 4: d"]
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 0.0, "c": 1.0, "d": 4.5}
    assert col(v, "finish") == {"a": 3.0, "b": 1.0, "c": 2.0, "d": 5.5}
    assert v.summary["slot_utilisation"] == 6 / (4 * 2)


@register_policy("test-slot-requests")
class SlotRequests(TokenPolicy):
    """Each request's own process asks for a slot by priority, preempting (tests only)."""

    class Params(PolicyParams):
        max_batch: int = slots_field(1)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        ctx.slots.preempt_hook = self.preempt_lower

    def processes(self):
        return [self.dispatch()]

    def dispatch(self):
        ctx = self.ctx
        while True:
            while ctx.waiting:
                ctx.env.process(self.client(ctx.waiting.popleft()))
            yield ctx.arrival

    def client(self, r):
        ctx = self.ctx
        while True:
            yield ctx.slots.request(priority=r.priority, preempt=True)
            ctx.admit(r)
            self.running.append(r)
            while r.state == orcasim.request.RequestState.RUNNING:
                yield ctx.slot_freed
            if r.state != orcasim.request.RequestState.PREEMPTED:
                return

    def preempt_lower(self, priority):
        victims = [r for r in self.running if r.priority > priority]
        if victims:
            victim = max(victims, key=lambda r: r.priority)
            self.running.remove(victim)
            self.ctx.preempted(victim, "priority", recompute=victim.num_computed_tokens)
            victim.num_computed_tokens = 0


def test_slot_requests_by_priority_with_preemption():
    reqs = [req("low", output=4, priority=5), req("high", arrival=1.5, output=2, priority=0)]
    v = simulate(reqs, {"type": "test-slot-requests"})
    # high arrives during step 2 and preempts low at once: low's part of that step is
    # lost; it asks again, gets the slot when high finishes and recomputes 2 tokens
    # (prompt and first output) before its second output token
    assert v.format_steps().splitlines() == ["step 1: low", "step 2: low", "step 3: high",
                                             "step 4: high", "step 5: low", "step 6: low",
                                             "step 7: low"]
    assert col(v, "num_preemptions") == {"low": 1, "high": 0}
    s = v.summary
    assert s["num_preemptions"] == 1 and s["num_preemptions_priority"] == 1
    assert col(v, "finish") == {"high": 4.0, "low": 7.0}
    assert col(v, "first_token") == {"high": 3.0, "low": 1.0}
    assert s["num_recomputed_tokens"] == 1


@register_policy("test-decode-process")
class DecodeProcess(KVDecodePolicy):
    """Decode-only batching admitted by a process when memory or a slot frees (tests only)."""

    class Params(KVPolicyParams):
        max_batch: int = slots_field(2)
        prefill: bool = False

    def admit(self):
        pass  # nothing at step boundaries: the process admits

    def processes(self):
        return [self.admit_loop()]

    def admit_loop(self):
        ctx = self.ctx
        while True:
            while ctx.waiting and ctx.slots.free:
                req = ctx.waiting.popleft()
                if self.try_join(req) is False:
                    ctx.waiting.appendleft(req)
                    break
            yield ctx.wake_event() | ctx.slot_freed


@pytest.mark.parametrize("memory", [None, {"num_blocks": 6, "block_size": 2}])
def test_a_decode_only_process_admits_during_steps_with_and_without_memory(memory):
    reqs = [req("a", prompt=3, output=3), req("b", prompt=3, output=2),
            req("c", arrival=0.5, prompt=3, output=2), req("d", arrival=0.6, prompt=3, output=1)]
    extra = {"memory": memory} if memory else {}
    v = simulate(reqs, {"type": "test-decode-process"}, **extra)
    # c arrives during step 1 with both slots taken; b's slot frees at t = 2: c joins for
    # step 3, d when a's frees at t = 3
    assert v.format_steps().splitlines() == [
        "step 1: a | b", "step 2: a | b", "step 3: a | c", "step 4: d | c"]
    assert col(v, "first_scheduled") == {"a": 0.0, "b": 0.0, "c": 2.0, "d": 3.0}
    assert col(v, "state") == dict.fromkeys("abcd", "finished")
    if memory is not None:
        # blocks of 2 tokens: at step 3, a holds 3 (5 tokens) and c 2 (3 tokens) of 6
        assert v.summary["kv_peak_usage"] == 5 / 6 and v.summary["num_preemptions"] == 0

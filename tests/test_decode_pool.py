"""The decode pool of token policies, srpt's kept order and lazily released keyed arrivals.

Each fast path is compared with per-step simulation (``Engine.fast_paths``
off: no runs, so no pool, and arrivals submitted one event each).
"""

from __future__ import annotations

import pytest

import orcasim
from orcasim.policies.decode_pool import DecodePool
from orcasim.request import Request
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import TOKEN_POLICIES, assert_identical, run_both


def decoding(rid: int, prompt: int, out: int, output_len: int, last: float) -> Request:
    """A running request that has just emitted its ``out``-th token at ``last``."""
    req = Request(rid, 0.0, prompt, output_len)
    req.num_output_tokens = out
    req.num_computed_tokens = prompt + out - 1
    req.last_token = last
    return req


def test_pool_members_advance_together_and_are_written_when_they_leave():
    pool = DecodePool()
    a = decoding(0, 10, 1, 5, 1.0)
    b = decoding(1, 20, 2, 10, 1.0)
    assert pool.advance(0, 1.0) == []
    pool.join_all([a, b])
    assert (pool.size, pool.kv, pool.first_finish()) == (2, 10 + 21, 4)
    assert a in pool and pool.members_of([(b, 1), (a, 1), (Request(2, 0.0, 5, 5), 5)])[0] == 2
    pool.advance(3, 2.5)  # three decode steps, the last ending at 2.5
    assert (pool.kv, pool.first_finish()) == (31 + 6, 1)
    assert a.num_output_tokens == 1  # not written yet: read through the pool
    assert (pool.output_tokens(a), pool.context(a), pool.context(b)) == (4, 13, 24)
    assert pool.due() == []
    assert pool.entries == [(a, 1), (b, 1)]  # a step's decode entries, in joining order
    assert pool.advance(1, 3.0) == [a]  # its last token, written
    assert pool.entries == [(b, 1)]
    assert (a.num_output_tokens, a.num_computed_tokens, a.last_token) == (5, 14, 3.0)
    assert (pool.size, pool.kv, pool.first_finish()) == (1, 25, 4)
    pool.sync()  # written, still a member
    assert (b.num_output_tokens, b.num_computed_tokens, b.last_token) == (6, 25, 3.0)
    pool.advance(2, 4.0)
    pool.leave(b)  # preempted: written, out
    assert (b.num_output_tokens, b.num_computed_tokens, b.last_token) == (8, 27, 4.0)
    assert (pool.size, pool.kv, pool.first_finish(), b in pool) == (0, 0, 1 << 62, False)
    pool.join(b)  # back later: a fresh entry, the old one skipped
    assert pool.first_finish() == 2
    pool.clear()
    assert (pool.size, pool.kv, b in pool) == (0, 0, False)


def test_pool_members_listed_in_their_entries_order_as_they_join_and_leave():
    """``reqs`` lists the members in the order of ``entries`` through one join, several, a
    finish from the middle, a departure and a clear."""
    pool = DecodePool()
    a, b, c, d = (decoding(i, 8, 1, n, 0.0) for i, n in enumerate((9, 4, 7, 6)))
    pool.join(a)
    pool.join_all([b, c])
    pool.join_all([d])
    assert pool.reqs == [a, b, c, d] and pool.entries == [(r, 1) for r in pool.reqs]
    assert pool.advance(3, 1.0) == [b]  # b's last token (4 - 1 = 3 steps)
    assert pool.reqs == [a, c, d] and pool.entries == [(r, 1) for r in pool.reqs]
    pool.leave(c)
    pool.join(b)
    assert pool.reqs == [a, d, b] and pool.entries == [(r, 1) for r in pool.reqs]
    pool.clear()
    assert pool.reqs == [] == pool.entries


def test_a_run_end_in_one_call_is_advance_then_join_all():
    """``end_run`` leaves two pools as ``advance``, ``join_all`` and ``first_finish`` do, run
    after run: finishers (none, one, several), joiners (none, one, several), a stale entry
    (``advance`` is ``end_run`` with nobody joining, so this checks the joins and the next
    finish; the tests above check the finishers by hand)."""
    import random

    rng = random.Random(7)

    def state(pool: DecodePool, reqs: list[Request]) -> tuple:
        return (pool.steps, pool.kv, pool.size, pool.last, pool._seq,
                [reqs.index(r) for r in pool.reqs], [(reqs.index(r), n) for r, n in pool.entries],
                sorted((d, s, reqs.index(r)) for d, s, r in pool._heap),
                [(r.num_output_tokens, r.num_computed_tokens, r.last_token) for r in reqs])

    lens = [rng.randint(2, 12) for _ in range(60)]
    pools = []
    for _ in range(2):
        reqs = [decoding(i, 5 + i % 3, 1, n, 0.0) for i, n in enumerate(lens)]
        pools.append((DecodePool(), reqs))
    nxt, t = 0, 0.0
    for _ in range(25):
        left = pools[0][0].first_finish()
        k = min(left, rng.randint(1, 4)) if left < 1 << 62 else rng.randint(1, 4)
        t += k
        take = rng.choice((0, 1, 1, 3))
        leave = rng.random() < 0.2
        got = []
        for i, (pool, reqs) in enumerate(pools):
            joining = [decoding(j, 5 + j % 3, 1, lens[j], t) for j in range(nxt, nxt + take)
                       if j < len(lens)]
            for r in joining:  # the same objects' places in ``reqs``
                reqs[r.id] = r
            if i == 0:
                done = pool.advance(k, t)
                pool.join_all(joining)
                got.append(([r.id for r in done], pool.first_finish()))
            else:
                done, first = pool.end_run(k, t, joining)
                got.append(([r.id for r in done], first))
            if leave and pool.size > 3:  # a member leaves: its heap entry goes stale
                pool.leave(pool.reqs[1])
        assert got[0] == got[1]
        assert state(*pools[0]) == state(*pools[1])
        nxt += take


def test_a_member_past_its_last_step_is_an_error():
    pool = DecodePool()
    pool.join(decoding(0, 4, 1, 3, 0.0))
    with pytest.raises(ValueError, match="finished 1 steps ago"):
        pool.advance(3, 1.0)


@pytest.mark.parametrize("name", ["fcfs", "sarathi", "priority-preempt", "srpt", "vtc"])
def test_pooled_runs_with_a_latency_model_that_reads_each_context(name):
    """The roofline model reads every scheduled request's context, which the plans list only
    when asked, members of the pool included."""
    over = {"policy": {**TOKEN_POLICIES[name], "max_batch": 16}, "variants": None,
            "engine.latency": {"type": "roofline", "model": "llama-2-7b", "gpu": "a100-80gb"},
            "workload.classes": [
                {"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
                {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"}]}
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"] * 0.8


@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_srpt_order_kept_between_sorts_is_the_sorted_order(monkeypatch, sigma):
    """srpt sorts its running requests once per boundary, and with true lengths not even
    after a run; at every use its order and victim equal sorting by the remaining length."""
    from orcasim.policies.srpt import SRPT
    order, worst = SRPT.order, SRPT.memory_victim
    kept = []

    def checked_order(self, reqs):
        before = self._ordered
        got = list(order(self, reqs))
        assert got == sorted(reqs, key=self.rank)
        kept.append(reqs is self.running and self._ordered is before)
        return got

    def checked_worst(self):
        got = worst(self)
        assert got is max(reversed(self.running), key=self.rank)
        return got

    monkeypatch.setattr(SRPT, "order", checked_order)
    monkeypatch.setattr(SRPT, "memory_victim", checked_worst)
    over = {"policy": {"type": "srpt", "sigma": sigma, "max_batch": 8}, "variants": None,
            "workload.arrival.rate": 20.0, "engine.latency.per_prefill_token": 0.0001}
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    assert fast["preemptions"]["num_preemptions_priority"] > 10
    assert (sum(kept) > 100) if sigma == 0.0 else not any(kept)


@pytest.mark.parametrize(("policy", "lazy"), [("fcfs", True), ("priority", True), ("sjf", True),
                                              ("vtc", True), ("class-share", True)])
def test_policy_queues_take_arrivals_released_at_step_boundaries(policy, lazy):
    """With runs, a keyed or per-group waiting queue takes the arrivals a lazy source
    releases at step boundaries (no event per arrival), as a plain deque does."""
    sc = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": 200, "variants": None, "policy": {"type": policy}})
    cfg = sc.variants[0]
    m = build_model(cfg, generate_workload(cfg))
    assert m.ctx.source.lazy is lazy
    m.env.run()
    assert m.recorder.num_arrived == 200 and len(m.ctx.waiting) == 0
    assert m.recorder.state_counts()[orcasim.request.RequestState.FINISHED] == 200


def test_priority_runs_go_past_arrivals_that_cannot_preempt(monkeypatch):
    """Without a classes mapping a request's level is its ``priority``: while every request
    still to come has a level no better than the worst running one, no arrival can preempt
    and a run goes past them; once a better one is ahead, runs end at arrivals again."""
    reqs = [{"arrival": 0.01 * i, "prompt_len": 8, "output_len": 40 + i % 7, "priority": 1}
            for i in range(30)]
    reqs.append({"name": "urgent", "arrival": 0.5, "prompt_len": 8, "output_len": 5,
                 "priority": 0})
    reqs += [{"arrival": 0.6 + 0.01 * i, "prompt_len": 8, "output_len": 30, "priority": 1}
             for i in range(10)]
    over = {"policy": {"type": "priority", "preempt": True, "max_batch": 4}, "variants": None,
            "workload": {"type": "list", "requests": reqs}}
    slow, fast = run_both(over, n=len(reqs), variant=None)
    assert_identical(slow, fast)
    assert fast["preemptions"]["num_preemptions_priority"] == 1  # urgent took a place
    same = {"policy": {"type": "priority", "preempt": True, "max_batch": 4}, "variants": None,
            "workload": {"type": "list", "requests": [{**r, "priority": 1} for r in reqs]}}
    from orcasim.policies.common import BatchPolicy
    from orcasim.policies.priority import Priority
    runs = []
    complete = BatchPolicy.complete_run
    monkeypatch.setattr(BatchPolicy, "complete_run",
                        lambda self, plan, ends: runs.append(1) or complete(self, plan, ends))
    slow2, fast2 = run_both(same, n=len(reqs), variant=None)
    assert_identical(slow2, fast2)
    assert fast2["preemptions"]["num_preemptions"] == 0
    bounded = len(runs)
    monkeypatch.setattr(Priority, "arrival_may_preempt", lambda self: True)
    runs.clear()
    assert_identical(*run_both(same, n=len(reqs), variant=None))
    assert bounded < len(runs) - 5  # runs no longer ended at arrivals


def test_keyed_queue_keeps_its_head_as_requests_come_and_go():
    """The head found once is kept until an entry before it comes or it leaves."""
    from orcasim.policies.queues import KeyedQueue
    reqs = [Request(i, float(i), 4, 4) for i in range(5)]
    q = KeyedQueue(lambda r: r.output_len - r.id)
    for r in reqs[:3]:
        q.append(r)  # keys 4, 3, 2
    assert q[0] is reqs[2] and q.peek_key() == 2
    q.append(reqs[3])  # key 1: the new head
    assert q[0] is reqs[3]
    q.remove(reqs[3])
    assert q[0] is reqs[2]
    q.remove(reqs[1])  # not the head: it stays
    assert q.top()[2] is reqs[2] and len(q) == 2
    assert q.popleft() is reqs[2] and q.popleft() is reqs[0] and not q
    q.append(reqs[4])
    assert q[0] is reqs[4]
    q.clear()
    with pytest.raises(IndexError):
        q.top()


def test_least_ahead_bounds_the_requests_still_to_come():
    reqs = [{"arrival": 0.1 * i, "prompt_len": 4, "output_len": 4, "priority": p}
            for i, p in enumerate([2, 0, 1, 3])]
    sc = orcasim.load_scenario("seed_orca").override(
        {"variants": None, "workload": {"type": "list", "requests": reqs}})
    m = build_model(sc.variants[0], generate_workload(sc.variants[0]))
    src = m.ctx.source
    assert src.least_ahead("priority", 0) == 0
    assert src.least_ahead("tenant", "none") == "none"  # no such column: the default
    src.flush(0.1)  # the first two arrived
    assert src.least_ahead("priority", 0) == 1
    src.flush(1.0)
    assert src.least_ahead("priority", 0) is None  # nobody left


def test_a_subclass_whose_order_may_read_counters_runs_without_the_pool():
    """A policy that reorders running requests by their counters, without saying it reads
    them through the pool, keeps the plain pass over each run (and its results)."""
    from orcasim.policies.common import BatchPolicy
    from orcasim.policies.fcfs import FCFS

    class MostGeneratedFirst(FCFS):
        def order(self, reqs):
            return sorted(reqs, key=lambda r: -r.num_output_tokens)

    sc = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": 50, "variants": None, "policy": {"type": "fcfs"}})
    cfg = sc.variants[0]
    m = build_model(cfg, generate_workload(cfg))
    pol = MostGeneratedFirst(m.engine.policy.params, None)
    assert pol._runs and not pol.pool_safe() and pol.pool is None
    assert BatchPolicy.pool_safe(m.engine.policy) and m.engine.policy.pool is not None


@pytest.mark.parametrize("name", ["fcfs", "sarathi", "priority-preempt"])
def test_runs_without_the_pool_equal_per_step_simulation(monkeypatch, name):
    """The plain pass over a run's requests (a policy that does not say it is pool safe)."""
    from orcasim.policies.common import BatchPolicy
    from orcasim.policies.keyed import KeyedPolicy
    from orcasim.policies.sarathi import Sarathi
    for cls in (BatchPolicy, KeyedPolicy, Sarathi):
        monkeypatch.setattr(cls, "pool_safe", lambda self: False)
    over = {"policy": {**TOKEN_POLICIES[name], "max_batch": 16}, "variants": None,
            "engine.latency.per_prefill_token": 0.0001}
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"] * 0.8


@pytest.mark.parametrize("name", ["fcfs", "prefill-first", "decode-first", "vtc"])
def test_the_pools_entries_are_the_first_running_requests_in_admission_order(monkeypatch, name):
    from orcasim.policies.common import BatchPolicy
    schedule_running = BatchPolicy.schedule_running
    seen = []

    def checked(self, budget):
        pool = self.pool
        if pool is not None and pool.size:
            assert pool.entries == [(r, 1) for r in self.running[:pool.size]]
            assert pool.reqs == [r for r, _ in pool.entries]  # (the members, in that order)
            assert set(pool.members) == set(self.running[:pool.size])
            seen.append(1)
        return schedule_running(self, budget)

    monkeypatch.setattr(BatchPolicy, "schedule_running", checked)
    over = {"policy": {**TOKEN_POLICIES[name], "max_batch": 16}, "variants": None,
            "engine.latency.per_prefill_token": 0.0001}
    assert_identical(*run_both(over, n=300, variant=None))
    assert len(seen) > 100


def test_keyed_queue_with_flat_entries_orders_as_nested_ones():
    """A queue of pair keys held as flat entries (``width=2``) serves in the same order."""
    import random

    from orcasim.policies.queues import KeyedQueue
    rnd = random.Random(3)
    reqs = [Request(i, float(rnd.randint(0, 5)), 4, rnd.randint(1, 4)) for i in range(200)]

    def key(r: Request) -> tuple[float, float]:
        return (float(r.output_len), r.arrival)

    nested, flat = KeyedQueue(key), KeyedQueue(key, width=2)
    served: tuple[list[Request], list[Request]] = ([], [])
    queued: list[Request] = []
    for r in reqs:
        op = rnd.random()
        if op < 0.55 or not queued:
            nested.append(r)
            flat.append(r)
            queued.append(r)
        elif op < 0.7:
            gone = queued.pop(rnd.randrange(len(queued)))
            nested.remove(gone)
            flat.remove(gone)
        else:
            assert nested.peek_key() == flat.peek_key() == key(nested[0])
            for q, out in zip((nested, flat), served, strict=True):
                out.append(q.popleft())
            queued.remove(served[0][-1])
            assert flat.entry_key(flat.popped) == nested.entry_key(nested.popped)
    assert served[0] == served[1] and list(nested) == list(flat)
    with pytest.raises(TypeError):
        KeyedQueue(lambda r: r.id, width=2).append(reqs[0])  # not a pair

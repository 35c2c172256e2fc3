"""The KV-limited decode policy's shortcuts give the answers of the slow path they skip.

A request at the head of the queue that was refused memory is refused again
from its block count alone (no allocator call), and a run of decode steps is
not cut at the finish step of a member that was preempted. Each test runs a
tight pool (hundreds of preemptions) and checks every shortcut taken against
the real allocator or batch, with runs through the policy (and, for the
refusals, through the engine's loop, :class:`~orcasim.policies.kv_loop.KVDecodeLoop`);
``tests/test_batch_runs.py`` compares the whole results with step-by-step simulation.
"""

from __future__ import annotations

import pytest

import orcasim
from orcasim.policies.kv_loop import KVDecodeLoop
from orcasim.policies.kv_preempt import queued_request
from orcasim.policies.kv_runs import KVDecodeRuns
from orcasim.policies.memory import KVDecodePolicy
from orcasim.simulation import build_model, generate_workload


def tight_model(n: int = 1500, **memory: object):
    sc = orcasim.load_scenario("seed_orca").override({
        "workload.num_requests": n, "variants": None,
        "policy": {"type": "continuous", "max_batch": 32},
        "memory": {"block_size": 16, "num_blocks": 400, **memory}})
    cfg = sc.variants[0]
    return build_model(cfg, generate_workload(cfg))


@pytest.mark.parametrize("loop", [True, False])
def test_a_refused_head_is_refused_again_exactly_when_the_allocator_refuses(monkeypatch, loop):
    monkeypatch.setattr(KVDecodeLoop, "enabled", loop)
    seen = {True: 0, False: 0}
    plain = KVDecodePolicy._refused_again

    def checked(self, miss, keep):
        again = plain(self, miss, keep)
        kv, req = self.kv, miss[0]
        if type(req) is list:  # a preempted row of the loop: the request it stands for
            req = queued_request(self.ctx.source, req)
        if not kv.has_getters:
            peak = kv.peak_allocated
            admitted = kv.admit(req, keep)  # the allocator's answer
            if admitted:  # undo it: the policy decides with the shortcut's answer
                kv.alloc.release(req)
                kv.peak_allocated = peak
            assert admitted is not again
            seen[again] += 1
        return again

    monkeypatch.setattr(KVDecodePolicy, "_refused_again", checked)
    m = tight_model()
    m.env.run()
    assert m.ctx.preemption_summary()["num_preemptions"] > 100
    assert seen[True] > 50 and seen[False] > 10


def test_runs_are_not_cut_at_a_preempted_members_finish(monkeypatch):
    monkeypatch.setattr(KVDecodeLoop, "enabled", False)  # runs through the policy's decode_run
    offered = {"runs": 0, "past_stale": 0}
    plain = KVDecodeRuns.decode_run

    def checked(self, plan=None):
        batch = self.batch
        live = [d for d, seq, req in batch._heap if req._batch_seq == seq]
        stale = [d for d, seq, req in batch._heap if req._batch_seq != seq]
        run = plain(self, plan)
        if run is not None:
            offered["runs"] += 1
            # the run ends at or before the first live member's finish, never later
            assert run[2] <= min(live) - batch.num_steps
            if stale and min(stale) < min(live):
                offered["past_stale"] += 1  # a preempted member's entry came first
        return run

    monkeypatch.setattr(KVDecodeRuns, "decode_run", checked)
    m = tight_model()
    m.env.run()
    assert m.ctx.preemption_summary()["num_preemptions"] > 100
    assert offered["runs"] > 100 and offered["past_stale"] > 10

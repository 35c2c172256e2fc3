"""TokenPolicy: the vLLM token rule (chunked prefill, first token, decode, ITL, finishing)."""

from __future__ import annotations

import pytest

import orcasim
from orcasim.policies.base import PolicyParams, TokenPolicy
from orcasim.registry import policies


@policies.register("test-chunked-fcfs")
class ChunkedFCFS(TokenPolicy):
    """FCFS, running requests first, each step at most ``budget`` tokens (tests only)."""

    class Params(PolicyParams):
        budget: int = 4
        max_batch: int = 8

    def next_step(self):
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            while ctx.waiting and len(self.running) < self.params.max_batch:
                req = ctx.waiting.popleft()
                ctx.admit(req)
                self.running.append(req)
            if self.running:
                break
            if ctx.arrivals_done:
                return None
            yield ctx.arrival
        budget = self.params.budget
        scheduled = []
        for req in self.running:
            need = req.num_tokens - req.num_computed_tokens
            n = min(need, budget)
            if n <= 0:
                break
            scheduled.append((req, n))
            budget -= n
        return self.make_plan(scheduled)


def run(requests, **params):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": {"type": "linear", "base": 1.0, "per_seq": 0.0, "per_token": 0.0,
                               "per_prefill_token": 0.5}},
        "policy": {"type": "test-chunked-fcfs", **params},
    })
    return orcasim.simulate(sc, trace_steps=True)["test-chunked-fcfs"]


def test_chunked_prefill_then_decode():
    v = run([{"name": "A", "prompt_len": 6, "output_len": 3}], budget=4)
    # steps: prefill 4 (1 + 0.5*4 = 3 s), prefill 2 + first token (2 s), decode (1 s), decode (1 s)
    df = v.requests.set_index("name")
    assert df.loc["A", "first_token"] == 5.0
    assert df.loc["A", "finish"] == 7.0
    assert v.summary["num_steps"] == 4
    assert v.summary["itl_p50"] == 1.0 and v.summary["tpot_mean"] == 1.0


def test_budget_shared_running_first():
    v = run([{"name": "A", "prompt_len": 3, "output_len": 2},
             {"name": "B", "prompt_len": 3, "output_len": 1}], budget=4)
    # step 1: A 3 (prefill, emits) + B 1 -> 1 + 0.5*4 = 3; step 2: A decode + B 2 (emits, done)
    # -> 1 + 0.5*2 = 2
    assert v.format_steps().splitlines() == ["step 1: A | B", "step 2: A | B"]
    df = v.requests.set_index("name")
    assert df["first_token"].to_dict() == {"A": 3.0, "B": 5.0}
    assert df["finish"].to_dict() == {"A": 5.0, "B": 5.0}


def test_make_plan_counts_prefill_decode_and_kv():
    from orcasim.request import Request

    pol = ChunkedFCFS(ChunkedFCFS.Params(), ctx=None)
    a = Request(0, 0.0, 10, 5)
    a.num_computed_tokens, a.num_output_tokens = 11, 2  # decoding its 2nd token
    b = Request(1, 0.0, 8, 5)
    b.num_computed_tokens = 4  # prefill chunk
    plan = pol.make_plan([(a, 1), (b, 4)])
    assert (plan.num_seqs, plan.num_decode_tokens, plan.num_prefill_tokens, plan.num_kv_tokens) == (
        2, 1, 4, 15)


@pytest.mark.parametrize("budget", [1, 3, 64])
def test_every_request_finishes_with_its_tokens(budget):
    reqs = [{"prompt_len": p, "output_len": o, "arrival": t}
            for p, o, t in [(5, 2, 0), (1, 7, 0.5), (9, 1, 1.0), (0, 3, 1.0), (4, 4, 9.0)]]
    v = run(reqs, budget=budget)
    df = v.requests
    assert (df["state"] == "finished").all()
    assert (df["num_output_tokens"] == df["output_len"]).all()
    assert (df["first_token"] > df["arrival"]).all()

"""The engine's loop over a token-level policy's boundaries against the engine's own path and
against step-by-step simulation.

:class:`~orcasim.policies.token_loop.TokenRunLoop` takes boundary after boundary of a
:class:`~orcasim.policies.common.BatchPolicy` without memory limits in one frame. Every test
runs the same model three ways (the loop; the engine's own boundaries,
``TokenRunLoop.enabled = False``; one event per step, ``Engine.fast_paths = False``) and
compares everything the run records.
"""

from __future__ import annotations

import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.policies.token_loop import TokenRunLoop
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import (
    TOKEN_POLICIES,
    assert_identical,
    snapshot,
    spy_ended,
    watch_and_stop,
)

WAYS = ("loop", "runs", "steps")
CLASSES = [{"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
           {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"},
           {"name": "rare", "weight": 0.2, "priority": 1, "tenant": "c"}]


def run_three(policy: dict, rate: float = 30.0, n: int = 600, watch: float | None = None,
              stop_at: float | None = None, overrides: dict | None = None) -> dict[str, dict]:
    """The seed scenario under ``policy`` each way; ``watch``: a process wakes every
    ``watch`` seconds (the loop hands boundaries to the engine before it); ``stop_at``: a
    hard stop then."""
    over = {"workload.num_requests": n, "policy": {**policy, "max_batch": 16}, "variants": None,
            "workload.arrival.rate": rate, "engine.latency.per_prefill_token": 0.0001,
            "workload.classes": CLASSES, **(overrides or {})}
    cfg = orcasim.load_scenario("seed_orca").override(over).variants[0]
    arrays = generate_workload(cfg)
    out = {}
    for way in WAYS:
        Engine.fast_paths = way != "steps"
        TokenRunLoop.enabled = way == "loop"
        try:
            m = build_model(cfg, arrays)
            ended = spy_ended(m)
            seen = watch_and_stop(m, len(arrays), watch, stop_at, lambda ctx: len(ctx.waiting))
            m.env.run()
        finally:
            Engine.fast_paths = True
            TokenRunLoop.enabled = True
        assert (type(m.engine._loop) is TokenRunLoop) == (way == "loop")
        out[way] = {**snapshot(m), "ended": ended, "seen": seen,
                    "num_started": m.ctx.num_started}
    return out


def assert_three_identical(out: dict[str, dict]) -> None:
    loop = out["loop"]
    for way in ("runs", "steps"):
        assert_identical(out[way], loop)
        assert out[way]["num_started"] == loop["num_started"], way
    # (a lazy source's arrivals wait outside the queue until a boundary: as the engine has it)
    assert out["runs"]["seen"] == loop["seen"]
    assert out["runs"]["events"] == loop["events"]  # the loop adds no event, and skips none


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", TOKEN_POLICIES)
def test_loop_equals_engine_runs_and_steps(name, rate):
    out = run_three(TOKEN_POLICIES[name], rate)
    assert_three_identical(out)


@pytest.mark.parametrize("name", ["sarathi", "srpt", "vtc", "prefill-first"])
def test_loop_hands_boundaries_to_the_engine_before_other_events(name):
    """A process with a timer: the loop stops before each step or run that ends after it
    (the engine runs the plan it made) and resumes after."""
    out = run_three(TOKEN_POLICIES[name], watch=0.37)
    assert_three_identical(out)
    assert len(out["loop"]["seen"]) > 100


@pytest.mark.parametrize("name", ["fcfs", "priority-preempt"])
def test_a_hard_stop_after_loop_boundaries(name):
    out = run_three(TOKEN_POLICIES[name], n=400, stop_at=7.001)
    assert_three_identical(out)
    assert "test_stop" in set(out["loop"]["columns"]["reason"])


def test_loop_with_a_step_function_latency_model():
    """A roofline model times decode steps by a function (no coefficients), and reads the
    listed requests of a mixed step."""
    out = run_three(TOKEN_POLICIES["sarathi"], rate=10.0, overrides={
        "engine.latency": {"type": "roofline", "model": "llama-2-7b", "gpu": "a100-80gb"}})
    assert_three_identical(out)


def test_the_loop_is_not_used_with_memory_limits():
    cfg = orcasim.load_scenario("seed_orca").override({
        "workload.num_requests": 20, "variants": None, "policy": {"type": "sarathi"},
        "memory": {"block_size": 16, "num_blocks": 400}}).variants[0]
    m = build_model(cfg, generate_workload(cfg))
    assert m.engine._loop is None


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", ["vtc", "class-share"])
def test_fair_share_with_one_group(name, rate):
    """A workload without tenants or classes: every request is in group ``None``, whose
    arrivals a lazy source's backlog queues at once."""
    out = run_three(TOKEN_POLICIES[name], rate, overrides={"workload.classes": None})
    assert_three_identical(out)
    assert list(out["loop"]["counters"]) == [None]


@pytest.mark.parametrize("policy", [
    {"type": "fcfs"},
    {"type": "fcfs", "token_budget": 300},
    {"type": "fcfs", "token_budget": 200, "chunked_prefill": False},
    {"type": "sarathi", "token_budget": 64},
])
@pytest.mark.parametrize("classes", [None, CLASSES])
def test_new_rows_admitted_inline_as_admit_waiting_does(policy, classes, monkeypatch):
    """``fcfs`` and ``sarathi`` admit a backlog's new rows after a run inline (whole prompts,
    split ones, a head that waits without chunked prefill, requests with or without
    per-request attributes): the same as ``admit_waiting`` through the engine's runs and
    step by step."""
    inline = []
    after_run = TokenRunLoop._after_run

    def spy(self):
        lo = self._lean._lo if self._lean is not None else None
        plan = after_run(self)
        if plan is not None and lo is not None and self._lean._lo > lo:
            inline.append(self._lean._lo - lo)
        return plan

    monkeypatch.setattr(TokenRunLoop, "_after_run", spy)
    out = run_three(policy, overrides={"workload.classes": classes})
    assert_three_identical(out)
    assert len(inline) > 100
    assert max(inline) > 1 or policy["type"] == "sarathi"


@pytest.mark.parametrize("name", ["prefill-first", "sarathi-tiny-budget", "decode-first"])
@pytest.mark.parametrize("output_len", [None, {"type": "uniform", "low": 1, "high": 3}])
def test_steps_completed_inline_as_complete_step_does(name, output_len, monkeypatch):
    """A step with none of the decode pool's members (``prefill-first``'s prompt-only steps,
    newcomers alone, prompt chunks of requests outside the pool) completes in the loop itself:
    the same as through the policy's ``complete_step`` (``TokenRunLoop.inline_steps``
    off), down to requests that finish with their first token."""
    from orcasim.policies.common import BatchPolicy

    seen = {"complete": 0, "inside": False, "finish_inline": 0}
    complete_step = BatchPolicy.complete_step
    finish_step = BatchPolicy.finish_step

    def spy_complete(self, plan, t_start, t_end):
        seen["complete"] += 1
        seen["inside"] = True
        try:
            complete_step(self, plan, t_start, t_end)
        finally:
            seen["inside"] = False

    def spy_finish(self, reqs, t_end):
        if not seen["inside"]:
            seen["finish_inline"] += 1
        finish_step(self, reqs, t_end)

    monkeypatch.setattr(BatchPolicy, "complete_step", spy_complete)
    monkeypatch.setattr(BatchPolicy, "finish_step", spy_finish)
    overrides = {} if output_len is None else {"workload.output_len": output_len}
    inline = run_three(TOKEN_POLICIES[name], overrides=overrides)
    assert_three_identical(inline)
    through_policy, finish_inline = seen["complete"], seen["finish_inline"]
    seen["complete"] = seen["finish_inline"] = 0
    monkeypatch.setattr(TokenRunLoop, "inline_steps", False)
    plain = run_three(TOKEN_POLICIES[name], overrides=overrides)
    assert_three_identical(plain)
    assert_identical(plain["loop"], inline["loop"])
    assert plain["loop"]["events"] == inline["loop"]["events"]
    assert seen["finish_inline"] == 0
    assert seen["complete"] > through_policy  # some steps were completed inline
    if name == "prefill-first":
        assert seen["complete"] - through_policy > 100
    if output_len is not None:
        assert finish_inline > 0

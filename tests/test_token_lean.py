"""The token policies' lean paths against the general steps they stand for.

Each lean path has a class switch that turns it off; every test runs the same model with
the switch on and off (on the token loop, and step by step) and compares everything the
run records.
"""

from __future__ import annotations

import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.policies.common import BatchPolicy
from orcasim.policies.fair import FairSharePolicy
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.prefill_first import PrefillFirst
from orcasim.policies.token_loop import TokenRunLoop
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import TOKEN_POLICIES, assert_identical, snapshot, spy_ended
from tests.test_token_loop import CLASSES

#: (class, switch) of each lean path
SWITCHES = {"keyed-admission": (KeyedPolicy, "lean_admission"),
            "backlog-admission": (BatchPolicy, "lean_backlog"),
            "prefill-first-plan": (PrefillFirst, "lean_plan"),
            "fair-admission": (FairSharePolicy, "lean_admission"),
            "fair-charge": (FairSharePolicy, "lean_charge"),
            "kept-entries": (TokenRunLoop, "lean_entries"),
            "past-arrivals": (TokenRunLoop, "past_arrivals")}

KEYED = ["priority-preempt", "priority-classes", "priority-aging", "srpt", "sjf", "edf"]
EXTRA = {
    "priority-no-preempt": {"type": "priority", "classes": {"interactive": 0, "batch": 1,
                                                            "rare": 2}},
    "srpt-oracle": {"type": "srpt"},
    "sjf-whole-prompts": {"type": "sjf", "chunked_prefill": False, "token_budget": 150},
    "edf-preempt": {"type": "edf", "preempt": True, "default_deadline": 5.0},
    "fcfs-whole-prompts": {"type": "fcfs", "chunked_prefill": False, "token_budget": 150},
    "prefill-first-small-budget": {"type": "prefill-first", "token_budget": 150},
    "vtc-weighted-whole-prompts": {"type": "vtc", "weights": {"b": 3.0}, "w_input": 0.5,
                                   "chunked_prefill": False, "token_budget": 150},
}
FIRST_COME = ["fcfs", "sarathi", "sarathi-tiny-budget", "prefill-first", "decode-first",
              "fcfs-whole-prompts", "prefill-first-small-budget"]


def policy_of(name: str) -> dict:
    return TOKEN_POLICIES[name] if name in TOKEN_POLICIES else EXTRA[name]


def run_switched(policy: dict, switch: str, rate: float, fast_paths: bool, n: int = 600
                 ) -> list[dict]:
    """The seed scenario under ``policy`` with the lean path ``switch`` on, then off."""
    over = {"workload.num_requests": n, "policy": {**policy, "max_batch": 16}, "variants": None,
            "workload.arrival.rate": rate, "engine.latency.per_prefill_token": 0.0001,
            "workload.classes": CLASSES}
    cfg = orcasim.load_scenario("seed_orca").override(over).variants[0]
    arrays = generate_workload(cfg)
    kind, attr = SWITCHES[switch]
    out = []
    for on in (True, False):
        setattr(kind, attr, on)
        Engine.fast_paths = fast_paths
        try:
            m = build_model(cfg, arrays)
            ended = spy_ended(m)
            m.env.run()
        finally:
            setattr(kind, attr, True)
            Engine.fast_paths = True
        out.append({**snapshot(m), "ended": ended})
    return out


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", KEYED + list(EXTRA))
def test_keyed_admission_equals_the_general_steps(name, rate, fast_paths):
    on, off = run_switched(policy_of(name), "keyed-admission", rate, fast_paths)
    assert_identical(off, on)
    assert on["events"] == off["events"]


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", [*KEYED, "srpt-oracle", "sjf-whole-prompts", "edf-preempt"])
def test_kept_entries_after_a_run_equal_the_policy_s(name, rate):
    on, off = run_switched(policy_of(name), "kept-entries", rate, True)
    assert_identical(off, on)
    assert on["events"] == off["events"]


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", FIRST_COME)
def test_backlog_admission_equals_the_general_steps(name, rate, fast_paths):
    on, off = run_switched(policy_of(name), "backlog-admission", rate, fast_paths)
    assert_identical(off, on)
    assert on["events"] == off["events"]


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", ["prefill-first", "prefill-first-small-budget"])
def test_prefill_first_plan_equals_the_general_steps(name, rate, fast_paths):
    on, off = run_switched(policy_of(name), "prefill-first-plan", rate, fast_paths)
    assert_identical(off, on)
    assert on["events"] == off["events"]


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("switch", ["fair-admission", "fair-charge"])
@pytest.mark.parametrize("name", ["vtc", "class-share", "vtc-weighted-whole-prompts"])
def test_fair_share_lean_paths_equal_the_general_steps(name, switch, rate, fast_paths):
    on, off = run_switched(policy_of(name), switch, rate, fast_paths)
    assert_identical(off, on)
    assert on["events"] == off["events"]
    assert len(on["counters"]) == 3


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", ["srpt", "srpt-oracle"])
def test_runs_past_arrivals_that_cannot_preempt_equal_the_general_steps(name, rate,
                                                                         monkeypatch):
    """A run of ``srpt`` with the true lengths goes past arrivals too long to preempt (the
    loop's ``_past``); off, each arrival ends it. Everything recorded is the same."""
    passed = []
    past = TokenRunLoop._past

    def counted(self, j, t, floor):
        out = past(self, j, t, floor)
        passed.append(out[0] - j)
        return out

    monkeypatch.setattr(TokenRunLoop, "_past", counted)
    on, off = run_switched(policy_of(name), "past-arrivals", rate, True)
    assert_identical(off, on)
    assert on["events"] == off["events"]
    if name != "srpt" and rate == 30.0:  # (with noisy predictions there is no floor)
        assert sum(passed) > 0

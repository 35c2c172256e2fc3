"""Shortcuts of the token-level policies give the results of the plain code, bit for bit.

Finished requests' rows held and written in blocks, keyed queues that hold
lazy arrivals as workload indices: each test runs a model with the shortcut
and without it and compares everything recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.policies.grouped import GroupedQueue
from orcasim.policies.queues import KeyedQueue
from orcasim.simulation import build_model, generate_workload

CLASSES = [{"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
           {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"}]


def run(policy: dict, *, spy: bool = False, fast: bool = True, n: int = 500,
        rate: float = 30.0, classes: list | None = CLASSES) -> tuple[dict, list]:
    """The seed scenario under ``policy``: its request columns, ITL samples, series and the
    order requests end in (with ``spy``, each recorded one by one as it ends)."""
    over = {"workload.num_requests": n, "workload.arrival.rate": rate, "variants": None,
            "engine.latency.per_prefill_token": 0.0001, "policy": {**policy, "max_batch": 16}}
    if classes is not None:
        over["workload.classes"] = classes
    sc = orcasim.load_scenario("seed_orca").override(over)
    cfg = sc.variants[0]
    arrays = generate_workload(cfg)
    Engine.fast_paths = fast
    try:
        m = build_model(cfg, arrays)
        queues: list = []
        if spy:
            record = m.recorder.record_request
            m.recorder.record_request = lambda req: record(req)  # (an override: one by one)
        if isinstance(m.ctx.waiting, KeyedQueue | GroupedQueue):
            queues.append(m.ctx.waiting)
        m.env.run()
    finally:
        Engine.fast_paths = True
    rec = m.recorder
    return {"columns": rec.request_columns(), "itl": rec.itl_samples(),
            "series": rec.series_rows(), "steps": rec.num_steps}, queues


def assert_same(a: dict, b: dict) -> None:
    assert a["steps"] == b["steps"]
    for name, col in a["columns"].items():
        if isinstance(col, np.ndarray):
            np.testing.assert_array_equal(col, b["columns"][name], err_msg=name)
        else:
            assert col == b["columns"][name], name
    for x, y in zip(a["itl"], b["itl"], strict=True):
        np.testing.assert_array_equal(x, y)
    for name, col in a["series"].items():
        np.testing.assert_array_equal(col, b["series"][name], err_msg=name)


POLICIES = {
    "fcfs": {"type": "fcfs"},
    "srpt": {"type": "srpt", "sigma": 0.5},
    "priority": {"type": "priority", "preempt": True, "classes": {"interactive": 0, "batch": 1}},
    "vtc": {"type": "vtc"},
}


@pytest.mark.parametrize("name", POLICIES)
def test_rows_held_in_blocks_equal_rows_recorded_as_requests_end(name):
    held, _ = run(POLICIES[name])
    one_by_one, _ = run(POLICIES[name], spy=True)
    assert_same(held, one_by_one)


KEYED = {
    "sjf": {"type": "sjf", "sigma": 0.3},
    "srpt": {"type": "srpt"},
    "priority": {"type": "priority", "preempt": True},
    "priority-aging": {"type": "priority", "aging_s": 0.5,
                       "classes": {"interactive": 0, "batch": 1}},
    "edf": {"type": "edf", "default_deadline": 4.0, "preempt": True},
}


GROUPED = {
    "vtc": {"type": "vtc", "weights": {"b": 3.0}},
    "class-share": {"type": "class-share", "weights": {"interactive": 2.0}},
}


@pytest.mark.parametrize("name", [*KEYED, *GROUPED])
@pytest.mark.parametrize("rate", [30.0, 3.0])
def test_queues_of_workload_indices_equal_queues_of_requests(name, rate):
    """Keyed and grouped queues fed by a lazy source hold indices; per step they hold
    requests."""
    policy = {**KEYED, **GROUPED}[name]
    lazy, (queue,) = run(policy, n=800, rate=rate)
    assert queue._of_row is not None  # the lazy source's arrivals were queued as indices
    eager, (plain,) = run(policy, n=800, rate=rate, fast=False)
    assert plain._of_row is None
    assert_same(lazy, eager)


def test_a_grouped_queue_without_the_groups_column_queues_every_request_in_one_group():
    lazy, _ = run({"type": "vtc"}, n=300, rate=10.0, classes=None)
    eager, _ = run({"type": "vtc"}, n=300, rate=10.0, classes=None, fast=False)
    assert_same(lazy, eager)


def test_a_class_the_priorities_do_not_list_is_an_error_from_a_lazy_queue_too():
    with pytest.raises(orcasim.errors.SimulationError, match=r"policy\.classes does not list"):
        run({"type": "priority", "classes": {"interactive": 0}})


def test_itl_samples_recorded_each_equal_samples_recorded_one_at_a_time():
    from orcasim.metrics.recorder import Recorder
    each, single = Recorder(), Recorder()
    for rec in (each, single):
        rec.record_step(0.0, 0.5, 2, 2, 0, 0)
    each.record_itl(0.25)
    each.record_itl_each(0.75, 3)
    each.record_itl_each(0.5, 0)
    each.record_itl_each(0.125, 1)
    for gap in (0.25, 0.75, 0.75, 0.75, 0.125):
        single.record_itl(gap)
    for rec in (each, single):
        rec.record_step(0.5, 1.25, 2, 2, 0, 2)
    np.testing.assert_array_equal(each.itl_times(), single.itl_times())
    for a, b in zip(each.itl_samples(), single.itl_samples(), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


@pytest.mark.parametrize("name", ["sjf", "srpt", "priority", "edf"])
def test_kept_decode_entries_are_the_running_order(monkeypatch, name):
    """A keyed policy's decode entries, kept as requests come and go, are the pairs of its
    running order each time."""
    from orcasim.policies.keyed import KeyedPolicy
    kept = KeyedPolicy.decode_entries
    calls = []

    def checked(self):
        entries = kept(self)
        assert entries == [(r, 1) for r in self.order_running()]
        calls.append(entries is not self._entries)
        return entries

    monkeypatch.setattr(KeyedPolicy, "decode_entries", checked)
    run(KEYED[name], n=400)
    assert len(calls) > 50 and all(calls)  # (each a copy)

"""Counted admission into a paged pool gives the results of one ``try_join`` per request.

:meth:`~orcasim.policies.kv_admit.KVAdmission._admit_counted` admits the head of the queue
into a plain paged pool in one loop. Every test runs the same model three ways (the counted
loop with the engine's runs; ``KVAdmission.counted_admission = False`` with runs; and
``counted_admission = False`` one event per step) and compares everything the run records.
"""

from __future__ import annotations

import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.errors import SimulationError
from orcasim.policies.kv_admit import KVAdmission
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import assert_identical, snapshot

TIGHT = {"block_size": 16, "num_blocks": 400}
SCENARIOS = {
    "tight": {"memory": TIGHT},
    "ample": {"memory": {"block_size": 16, "num_blocks": 100_000}},
    "light": {"memory": {"block_size": 8, "num_blocks": 600}, "workload.arrival.rate": 1.5,
              "policy.max_batch": 8},
    "watermark": {"memory": TIGHT, "policy.watermark": 0.05},
    # requests rejected at the head: too long for the model, or for the whole pool
    "max_model_len": {"memory": {**TIGHT, "max_model_len": 1100}},
    # a preempted request outgrows the pool: the run stops with an error
    "small_pool": {"memory": {"block_size": 16, "num_blocks": 70}},
    "prefill": {"memory": TIGHT, "policy.prefill": True,
                "engine.latency.per_prefill_token": 0.0001},
    "swap": {"memory": {"block_size": 16, "num_blocks": 300, "bytes_per_token": 1000,
                        "swap_space_gb": 0.002, "pcie_bandwidth": 1e9},
             "policy.preemption": "swap"},
}


def run_three(overrides: dict, n: int = 1500, variant: str = "continuous") -> dict[str, dict]:
    """The seed scenario's ``variant`` with ``overrides``: counted, allocator, steps."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variant(variant)
    arrays = generate_workload(cfg)
    out = {}
    for way in ("counted", "allocator", "steps"):
        Engine.fast_paths = way != "steps"
        KVAdmission.counted_admission = way == "counted"
        calls = [0]
        plain = KVAdmission._admit_counted

        def counted(self, room, *put_back, plain=plain, calls=calls):
            calls[0] += 1
            return plain(self, room, *put_back)

        KVAdmission._admit_counted = counted  # type: ignore[method-assign]
        try:
            m = build_model(cfg, arrays)
            error = None
            try:
                m.env.run()
            except SimulationError as err:
                error = str(err)
        finally:
            Engine.fast_paths = True
            KVAdmission.counted_admission = True
            KVAdmission._admit_counted = plain  # type: ignore[method-assign]
        assert (calls[0] > 0) == (way == "counted")
        out[way] = {
            **snapshot(m),
            "num_started": m.ctx.num_started,
            "error": error,
        }
    return out


def assert_three_identical(out: dict[str, dict]) -> None:
    for way in ("allocator", "steps"):
        assert_identical(out[way], out["counted"])
        for key in ("num_started", "error"):
            assert out[way][key] == out["counted"][key], (way, key)


@pytest.mark.parametrize("name", SCENARIOS)
def test_counted_admission_equals_the_allocators(name):
    out = run_three(SCENARIOS[name])
    assert_three_identical(out)
    if name in ("tight", "watermark", "swap"):
        assert out["counted"]["preemptions"]["num_preemptions"] > 50
    if name == "max_model_len":
        assert "exceeds_max_model_len" in set(out["counted"]["columns"]["reason"])
    assert (out["counted"]["error"] is not None) == (name == "small_pool")


def test_counted_admission_of_static_batches():
    out = run_three({"memory": TIGHT}, n=500, variant="static")
    assert_three_identical(out)

"""The seed scenario reproduces the notebook's numbers, and its per-request schedule exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

import orcasim

# The notebook's printed results (its "ttft" is our queue delay).
NOTEBOOK = {
    "static": {
        "throughput_tok_s": 178.804938,
        "queue_delay_p50": 161.722704,
        "queue_delay_p99": 339.670493,
        "e2e_p50": 176.096393,
        "e2e_p99": 344.763539,
    },
    "continuous": {
        "throughput_tok_s": 198.496001,
        "queue_delay_p50": 129.160421,
        "queue_delay_p99": 275.044119,
        "e2e_p50": 150.159041,
        "e2e_p99": 298.654174,
    },
}


@pytest.fixture(scope="module")
def seed_results():
    return orcasim.simulate(orcasim.load_scenario("seed_orca"))


def test_seed_scenario_matches_notebook_table(seed_results):
    for variant, metrics in NOTEBOOK.items():
        for name, expected in metrics.items():
            got = seed_results.summary[variant][name]
            # the table is printed to 6 decimals
            assert got == pytest.approx(expected, abs=5e-7), (variant, name)


def test_seed_scenario_matches_notebook_loop_to_1e9(seed_results, notebook_loop):
    ref = notebook_loop.reference()
    for variant in ("static", "continuous"):
        for name, expected in ref[variant].items():
            got = seed_results.summary[variant][name]
            assert math.isclose(got, expected, rel_tol=1e-9), (variant, name, got, expected)


def test_throughput_ratio_is_1_11_not_2(seed_results):
    s = seed_results.summary
    ratio = s["continuous"]["throughput_tok_s"] / s["static"]["throughput_tok_s"]
    assert ratio == pytest.approx(1.110126, abs=1e-6)


def _notebook_schedule(notebook_loop, fn, n, lam, seed, max_batch):
    reqs = notebook_loop.workload(n, lam, seed)
    fn(reqs, max_batch, notebook_loop.lat((0.005, 0.0008, 0.00002)))
    return reqs


@pytest.mark.parametrize("seed,n,rate,max_batch", [(0, 500, 30.0, 32), (1, 300, 2.0, 8),
                                                     (7, 400, 1.0, 16), (3, 200, 50.0, 4)])
@pytest.mark.parametrize("variant", ["static", "continuous"])
def test_per_request_schedule_is_bit_identical(notebook_loop, seed, n, rate, max_batch, variant):
    sc = orcasim.load_scenario("seed_orca").override({
        "workload.num_requests": n,
        "workload.arrival.rate": rate,
        f"variants.{variant}.policy.max_batch": max_batch,
    })
    res = orcasim.simulate(sc, seed=seed, variants=[variant])
    df = res[variant].requests.sort_values("id")
    ref = _notebook_schedule(notebook_loop, getattr(notebook_loop, variant), n, rate, seed,
                             max_batch)
    assert df["arrival"].tolist() == [r["arrival"] for r in ref]
    assert df["prompt_len"].tolist() == [r["prompt_len"] for r in ref]
    assert df["output_len"].tolist() == [r["output_len"] for r in ref]
    assert df["first_scheduled"].tolist() == [r["started_at"] for r in ref]
    assert df["finish"].tolist() == [r["finished_at"] for r in ref]
    assert (df["state"] == "finished").all()


def test_latency_metrics_match_a_token_by_token_replay(notebook_loop):
    """TTFT, TPOT and ITL computed from the notebook loop token by token equal ours exactly."""
    n, lam, seed, max_batch = 400, 5.0, 2, 16
    reqs = notebook_loop.workload(n, lam, seed)
    step = notebook_loop.lat((0.005, 0.0008, 0.00002))
    # continuous batching, recording every token's time
    pending = list(reqs)
    active = []
    now = 0.0
    token_times = {r["idx"]: [] for r in reqs}
    while pending or active:
        while pending and pending[0]["arrival"] <= now and len(active) < max_batch:
            active.append(pending.pop(0))
        if not active:
            now = pending[0]["arrival"]
            continue
        now += step(len(active), sum(r["prompt_len"] + r["tokens_done"] for r in active))
        for r in active:
            r["tokens_done"] += 1
            token_times[r["idx"]].append(now)
        active = [r for r in active if r["tokens_done"] < r["output_len"]]
    ttft = np.array([token_times[r["idx"]][0] - r["arrival"] for r in reqs])
    tpot = np.array([(t[-1] - t[0]) / (len(t) - 1) for t in token_times.values() if len(t) > 1])
    itl = np.concatenate([np.diff(t) for t in token_times.values()])

    sc = orcasim.load_scenario("seed_orca").override({
        "workload.num_requests": n, "workload.arrival.rate": lam,
        "variants.continuous.policy.max_batch": max_batch})
    s = orcasim.simulate(sc, seed=seed, variants=["continuous"]).summary["continuous"]
    for name, x in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for q in (50, 90, 99):
            assert s[f"{name}_p{q}"] == pytest.approx(float(np.percentile(x, q)), rel=1e-12)
        assert s[f"{name}_mean"] == pytest.approx(float(x.mean()), rel=1e-12)

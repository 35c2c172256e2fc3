"""Every policy x every memory allocator x every admission controller x both preemptions.

Each combination either runs to the end on a small overloaded workload with
memory pressure, and its results hold together, or is refused up front with
one line naming the field. ``python tests/test_matrix.py`` prints the counts.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import orcasim
from orcasim.errors import ScenarioError

POLICIES = [n for n in orcasim.policy_registry.names()
            if orcasim.policy_registry.get(n).__module__.startswith("orcasim.policies.")]
POLICY_PARAMS = {
    "priority": {"classes": {"interactive": 0, "batch": 1}, "preempt": True},
    "class-share": {"weights": {"interactive": 3, "batch": 1}},
    "edf": {"preempt": True, "default_deadline": 30.0},
    "srpt": {"sigma": 0.5},
    "vllm-v1": {"policy": "priority"},
}
#: None: no memory section (unlimited KV memory)
MEMORY = {
    "unlimited": None,
    "paged": {"allocator": "paged"},
    "max": {"allocator": "max"},
    "pow2": {"allocator": "pow2"},
    "oracle": {"allocator": "oracle"},
    "oracle-buddy": {"allocator": "oracle", "placement": "buddy"},
}
ADMISSION = {
    "none": [],
    "max_queue": [{"type": "max_queue", "limit": 6}],
    "token_bucket": [{"type": "token_bucket", "rate": 3.0, "burst": 4.0}],
    "kv_fit": [{"type": "kv_fit"}],
    "slo_ttft": [{"type": "slo_ttft", "ttft": 4.0, "base_s": 0.1}],
    "shed": [{"type": "shed", "limit": 5, "classes": {"interactive": 0, "batch": 1}}],
}
PREEMPTION = ["recompute", "swap"]


def requests(n: int = 40, seed: int = 3) -> list[dict]:
    """An overloaded mix of two classes and two tenants, with deadlines and priorities."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.1, n))
    out = []
    for i in range(n):
        inter = bool(rng.random() < 0.5)
        out.append({
            "name": f"r{i}", "arrival": float(t[i]),
            "prompt_len": int(rng.integers(1, 40)), "output_len": int(rng.integers(1, 30)),
            "cls": "interactive" if inter else "batch", "tenant": "a" if i % 3 else "b",
            "priority": 0 if inter else 1, "deadline": 5.0 if inter else 60.0,
        })
    return out


REQUESTS = requests()


def scenario(policy: str, memory: str, admission: str, preemption: str) -> orcasim.Scenario:
    pol = {"type": policy, **POLICY_PARAMS.get(policy, {})}
    if policy != "vllm-v1":
        pol["max_batch"] = 6
        if MEMORY[memory] is not None:
            pol["preemption"] = preemption
    elif preemption == "swap":
        pol["preemption"] = preemption  # vllm-v1 preempts by recompute only: refused
    sc = {
        "workload": {"type": "list", "requests": REQUESTS},
        "engine": {"latency": {"type": "linear", "base": 0.01, "per_seq": 0.002,
                               "per_token": 0.0001, "per_prefill_token": 0.0005}},
        "policy": pol,
        "admission": ADMISSION[admission],
        "events": [{"type": "hard_stop", "at": 3.0}],
        "clients": {"patience": 0.4, "timeout": 1.0},
    }
    if MEMORY[memory] is not None:
        sc["memory"] = {"num_blocks": 24, "block_size": 4, "max_model_len": 80,
                        "bytes_per_token": 1000, "swap_space_gb": 1e-4, "pcie_bandwidth": 1e6,
                        **MEMORY[memory]}
    return orcasim.Scenario(sc)


def run_one(policy: str, memory: str, admission: str, preemption: str) -> str | None:
    """Run one combination and check it; the refusal's one-line message, or None if it ran."""
    try:
        sc = scenario(policy, memory, admission, preemption)
        res = orcasim.simulate(sc)
    except ScenarioError as err:
        msg = str(err)
        assert "\n" not in msg and msg
        return msg
    v = next(iter(res.values()))
    df = v.requests
    n = len(REQUESTS)
    assert len(df) == n and df["id"].is_unique
    assert set(df["state"]) <= {"finished", "rejected", "aborted"}
    s = v.summary
    assert s["num_finished"] + s["num_rejected"] + s["num_aborted"] == n
    assert (df.loc[df["state"] != "finished", "reason"].notna()).all()
    fin = df[df["state"] == "finished"]
    for c in ("first_scheduled", "first_token", "finish"):
        assert np.isfinite(fin[c]).all()
    assert (fin["first_scheduled"] >= fin["arrival"]).all()
    assert (fin["first_token"] > fin["first_scheduled"]).all()
    assert (fin["finish"] >= fin["first_token"]).all()
    assert (fin["num_output_tokens"] == fin["output_len"]).all()
    assert "num_preemptions" in s and "slot_utilisation" in s
    assert 0 <= s["slot_utilisation"] <= 1
    if MEMORY[memory] is not None:
        assert 0 < s["kv_peak_usage"] <= 1
    return None


COMBOS = list(itertools.product(POLICIES, MEMORY, ADMISSION, PREEMPTION))


def expected_refusal(policy: str, memory: str, admission: str, preemption: str) -> str | None:
    """The field a combination is refused on, or None where it must run."""
    if policy == "vllm-v1" and preemption == "swap":
        return "policy.preemption"
    if policy == "vllm-v1" and memory not in ("unlimited", "paged"):
        return "memory.allocator"
    if memory not in ("unlimited", "paged") and preemption == "swap":
        return "policy.preemption"
    if memory == "unlimited" and admission == "kv_fit" and policy != "vllm-v1":
        return "admission.0"
    return None


def test_the_matrix_covers_every_policy():
    assert len(POLICIES) == 13 and "vllm-v1" in POLICIES


@pytest.mark.parametrize("policy", POLICIES)
def test_every_combination_runs_or_is_refused_up_front(policy):
    for combo in COMBOS:
        if combo[0] != policy:
            continue
        refused = run_one(*combo)
        field = expected_refusal(*combo)
        if field is None:
            assert refused is None, (combo, refused)
        else:
            assert refused is not None and field in refused, (combo, refused)


if __name__ == "__main__":
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for combo in COMBOS:
        msg = run_one(*combo)
        counts["refused" if msg else "ran"] = counts.get("refused" if msg else "ran", 0) + 1
        if msg:
            key = msg.split(": ", 2)[-1][:90]
            reasons[key] = reasons.get(key, 0) + 1
    print(f"{len(COMBOS)} combinations: {counts}")
    for r, k in sorted(reasons.items(), key=lambda x: -x[1]):
        print(f"  {k:4d}  {r}")

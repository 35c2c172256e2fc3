"""Lockstep data-parallel groups: engines that start every step together and step as long as
the slowest (orcasim.cluster.lockstep)."""

from __future__ import annotations

import pytest

from orcasim.cluster.lockstep import LockstepGroup, step_times
from orcasim.cluster.model import build_cluster_model, check_cluster_conservation
from orcasim.errors import ScenarioError
from orcasim.plan import StepPlan
from orcasim.request import RequestState
from orcasim.scenario import Scenario
from orcasim.simulation import generate_workload, simulate

# a step takes 1 s plus 0.5 s per prompt token; a dummy step (one decode) 1 s
ENGINE = {"latency": {"type": "linear", "base": 1.0, "per_seq": 0, "per_token": 0,
                      "per_prefill_token": 0.5}}
POLICY = {"type": "continuous", "max_batch": 8, "prefill": True}
REQUESTS = [  # round robin: A, C, E on r-0; B, D, F on r-1
    {"name": "A", "arrival": 0, "prompt_len": 2, "output_len": 3},
    {"name": "B", "arrival": 0, "prompt_len": 6, "output_len": 1},
    {"name": "C", "arrival": 4.5, "prompt_len": 2, "output_len": 1},
    {"name": "D", "arrival": 5.5, "prompt_len": 2, "output_len": 2},
    {"name": "E", "arrival": 20.5, "prompt_len": 2, "output_len": 1},
    {"name": "F", "arrival": 40, "prompt_len": 2, "output_len": 1},
]


def _scenario(lockstep: bool) -> Scenario:
    group = {"name": "r", "count": 2, **({"lockstep": True} if lockstep else {})}
    return Scenario({"name": "dp", "engine": ENGINE,
                     "policy": POLICY,
                     "workload": {"type": "list", "requests": REQUESTS},
                     "cluster": {"router": "round_robin", "groups": [group]}})


def _run(lockstep: bool):
    cfg = _scenario(lockstep).variants[0]
    arrays = generate_workload(cfg)
    m = build_cluster_model(cfg, arrays, trace_steps=True)
    m.env.run()
    check_cluster_conservation(cfg, m, len(arrays))
    steps = {r.name: [(t0, t1) for _, t0, t1, _ in r.recorder.steps] for r in m.replicas}
    return m, steps


def test_two_engines_step_together_for_as_long_as_the_slower_with_dummy_steps():
    m, steps = _run(lockstep=True)
    # t=0: A's prompt (1 + 0.5 x 2 = 2 s) and B's (1 + 0.5 x 6 = 4 s) start together and
    # both end at 4. r-1 is then empty: r-0's decodes of A (1 s) run beside r-1's dummy steps
    # (1 s), [4, 5] and [5, 7]: C arrived at 4.5, joins at 5 (A's decode + C's prompt, 2 s).
    # D reaches the idle r-1 at 5.5, in the group's step [5, 7]: its prompt waits for that
    # step's end and runs [7, 9] (r-0, empty, dummy), its decode [9, 10].
    # From 10 every engine is idle, the group still running: dummy steps 10, 11, ... (no
    # events); E reaches r-0 at 20.5 in the dummy step [20, 21] and runs [21, 23]. The group
    # counts its steps (5 by t=10, 10 dummy ones to 20, 16 at 21, 17 at 23); the all-reduce
    # of the 32nd step (its end at 23 + 15 = 38) finds nothing unfinished and the group
    # stops, so F, at 40, starts at once.
    assert steps == {"r-0": [(0.0, 4.0), (4.0, 5.0), (5.0, 7.0), (21.0, 23.0)],
                     "r-1": [(0.0, 4.0), (7.0, 9.0), (9.0, 10.0), (40.0, 42.0)]}
    (g,) = m.lockstep
    assert [m.steps for m in g.members] == [4, 4]
    assert [m.dummy_steps for m in g.members] == [3, 3]  # beside the other's steps
    assert g.num_steps == 7  # [0,4] [4,5] [5,7] [7,9] [9,10] [21,23] [40,42]
    assert g.num_dummy_only_steps == 11 + 15  # [10, 21] and [23, 38]
    assert g.running and g.counter == 1  # F's wave, one step in, runs dummy steps on


def test_the_same_scenario_without_lockstep_steps_each_engine_on_its_own():
    _, steps = _run(lockstep=False)
    assert steps == {"r-0": [(0.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.5, 6.5), (20.5, 22.5)],
                     "r-1": [(0.0, 4.0), (5.5, 7.5), (7.5, 8.5), (40.0, 42.0)]}


def test_lockstep_engines_step_one_event_at_a_time_with_or_without_fast_paths(monkeypatch):
    from orcasim.engine import Engine

    _, fast = _run(lockstep=True)
    monkeypatch.setattr(Engine, "fast_paths", False)
    _, slow = _run(lockstep=True)
    assert fast == slow


def test_lockstep_results_are_what_the_steps_give_and_rerun_bit_for_bit():
    (v,) = simulate(_scenario(True)).values()
    df = v.requests.set_index("name")
    assert df.loc[list("ABCDEF"), "finish"].tolist() == [7.0, 4.0, 7.0, 10.0, 23.0, 42.0]
    assert df.loc[list("ABCDEF"), "first_token"].tolist() == [4.0, 4.0, 7.0, 9.0, 23.0, 42.0]
    (again,) = simulate(_scenario(True)).values()
    assert again.requests.equals(v.requests)


def test_dp_padding_pads_every_engine_to_the_largest_graph_only_when_all_run_graphs():
    class Graphs:
        """Records what the group asks: a CUDA graph at 1, 8, 16 tokens."""

        type_name = "graphs"

        def __init__(self):
            self.asked = []

        def graph_tokens(self, n):
            for s in (1, 8, 16):
                if n <= s:
                    return s, True
            return n, False

        def lockstep_time(self, plan, tokens, moe_tokens, gather_tokens):
            self.asked.append((plan, tokens, moe_tokens, gather_tokens))
            return 0.001 * tokens

    a, b = Graphs(), Graphs()
    decode3, prefill12 = StepPlan(3, 30), StepPlan(1, 0, 12, 0)
    # both in graphs: 3 -> 8 and 12 -> 16, so both compute 16 tokens
    assert step_times([a, b], [decode3, prefill12]) == [0.016, 0.016]
    assert a.asked[-1] == (decode3, 16, 16.0, 16) and b.asked[-1] == (prefill12, 16, 16.0, 16)
    # a dummy step (one token) pads to the other's graph too
    assert step_times([a, b], [None, decode3]) == [0.008, 0.008]
    assert a.asked[-1] == (None, 8, 8.0, 8)
    # 40 tokens is past the graphs: no DP padding, each its own count; MoE at the mean
    big = StepPlan(1, 0, 40, 0)
    assert step_times([a, b], [decode3, big]) == [0.008, 0.04]
    assert a.asked[-1] == (decode3, 8, 24.0, 40) and b.asked[-1] == (big, 40, 24.0, 40)
    # an engine's own time (as the engine computed it) stands where the group's counts are
    # its own: prefill12 pads to 16 anyway, decode3 is asked again at 16
    n = len(b.asked)
    assert step_times([a, b], [decode3, prefill12], [9.0, 9.0]) == [0.016, 9.0]
    assert len(b.asked) == n and a.asked[-1] == (decode3, 16, 16.0, 16)


def test_the_profile_model_in_a_group_pads_and_reads_moe_at_the_mean(tmp_path):
    from test_profile_formats import model, write_moe_profile

    # two layers of qkv 10 us + attention 5 us + MoE; lm_head 100 us; two gathers a layer of
    # 1 us + (ep - 1) x 64 x 2 bytes / 1 GB/s = 0.128 us per token
    lat = model(write_moe_profile(tmp_path / "p"), num_experts=4, experts_per_token=2,
                expert_parallel=2, hidden_size=64, allreduce_bandwidth=1e9,
                allreduce_latency=1e-6, cudagraph_capture_sizes=[1, 2, 4])
    plan = StepPlan(2, 0)
    assert lat.graph_tokens(2) == (2, True) and lat.graph_tokens(3) == (4, True)
    assert lat.graph_tokens(5) == (5, False)
    # the group's counts equal to its own: the model's own step time, exactly
    assert lat.lockstep_time(plan, 2, 2.0, 2) == lat.step_time(plan)
    # padded to 4 tokens, MoE at 3 per engine, gathers at 4
    assert lat.lockstep_time(plan, 4, 3.0, 4) == pytest.approx(
        2 * (10e-6 + 5e-6 + lat.moe(3.0)) + 100e-6 + 4 * 1e-6 + 4 * 0.128e-6 * 4, rel=1e-12)
    # a dummy step: the forward pass without the lm_head
    assert lat.lockstep_time(None, 4, 3.0, 4) == pytest.approx(
        2 * (10e-6 + 5e-6 + lat.moe(3.0)) + 4 * 1e-6 + 4 * 0.128e-6 * 4, rel=1e-12)
    assert lat.moe(3.0) > lat.moe(2.0) > 0


def test_a_replica_that_ran_out_of_work_takes_dummy_steps_for_the_rest():
    raw = {"name": "dp", "engine": ENGINE, "policy": POLICY,
           "workload": {"type": "list", "requests": [
               {"name": "A", "arrival": 0, "prompt_len": 6, "output_len": 1},
               {"name": "B", "arrival": 0, "prompt_len": 2, "output_len": 3}]},
           "cluster": {"router": "round_robin", "groups": [{"count": 2, "lockstep": True}]}}
    cfg = Scenario(raw).variants[0]
    m = build_cluster_model(cfg, generate_workload(cfg), trace_steps=True)
    m.env.run()
    # both prompts [0, 4] (A's 4 s, B's 2 s); r-0 has no more work: B's decodes [4, 5],
    # [5, 6] beside its dummy steps
    assert [(t0, t1) for _, t0, t1, _ in m.replicas[1].recorder.steps] == [
        (0.0, 4.0), (4.0, 5.0), (5.0, 6.0)]
    (g,) = m.lockstep
    assert [x.dummy_steps for x in g.members] == [2, 0]


@pytest.mark.parametrize("group, extra, match", [
    ({"count": 1, "lockstep": True}, {}, "count >= 2"),
    ({"count": 2, "lockstep": True},
     {"faults": {"events": [{"replica": "g0-0", "at": 1}]}}, "cluster.faults"),
    ({"count": 2, "lockstep": True}, {"autoscaling": {"target": 2}}, "cluster.autoscaling"),
])
def test_impossible_lockstep_groups_are_refused(group, extra, match):
    raw = {"name": "dp", "engine": ENGINE, "policy": POLICY,
           "workload": {"type": "list", "requests": REQUESTS},
           "cluster": {"router": "round_robin", "groups": [group], **extra}}
    with pytest.raises(ScenarioError, match=match):
        Scenario(raw)


def test_group_is_built_only_for_lockstep_groups():
    cfg = _scenario(False).variants[0]
    m = build_cluster_model(cfg, generate_workload(cfg))
    assert m.lockstep == [] and all(r.engine.group is None for r in m.replicas)
    cfg = _scenario(True).variants[0]
    m = build_cluster_model(cfg, generate_workload(cfg))
    (g,) = m.lockstep
    assert isinstance(g, LockstepGroup)
    assert [r.engine.group for r in m.replicas] == [g, g]


def test_stopping_the_engines_mid_step_and_at_the_barrier_ends_every_request_once():
    cfg = _scenario(True).variants[0]
    arrays = generate_workload(cfg)
    m = build_cluster_model(cfg, arrays)
    m.env.run(until=6.0)  # r-0 in the group's step [5, 7]; D (r-1) waits at the barrier
    (g,) = m.lockstep
    assert g.step_end == 7.0 and g.members[1].plan is not None
    for r in m.replicas:
        r.engine.stop("shutdown")
    m.env.run()
    check_cluster_conservation(cfg, m, len(arrays))
    (v,) = simulate(_scenario(True)).values()  # the same run, not stopped, for the names
    names = dict(zip(v.requests["id"], v.requests["name"], strict=True))
    ended = {names[i]: RequestState(s).name for r in m.replicas
             for i, s in zip(r.recorder.request_columns()["id"],
                             r.recorder.request_columns()["state"], strict=True)}
    assert ended == {"A": "ABORTED", "B": "FINISHED", "C": "ABORTED", "D": "ABORTED",
                     "E": "REJECTED", "F": "REJECTED"}


def test_the_cluster_pages_lockstep_example_gives_the_schedule_it_describes():
    import re

    import yaml
    from conftest import ROOT

    page = (ROOT / "docs" / "clusters.md").read_text()
    part = page.split("## Data-parallel engines in lockstep")[1].split("\n## ")[0]
    (block,) = re.findall(r"^```yaml\n(.*?)^```", part, re.S | re.M)
    raw = {"name": "dp", **yaml.safe_load(block)}
    (v,) = simulate(Scenario(raw)).values()
    df = v.requests.set_index("name")
    assert df.loc[["A", "B"], "finish"].tolist() == [6.0, 4.0]
    assert df.loc[["A", "B"], "replica"].tolist() == ["dp-0", "dp-1"]
    raw["cluster"]["groups"][0]["lockstep"] = False
    (v,) = simulate(Scenario(raw)).values()
    assert v.requests.set_index("name").loc[["A", "B"], "finish"].tolist() == [4.0, 4.0]


def test_vllm_v1_engines_in_lockstep_share_every_step_they_overlap():
    raw = {"name": "v1", "seed": 3,
           "engine": {"latency": {"type": "linear", "base": 0.01, "per_seq": 0.001,
                                  "per_token": 1e-6, "per_prefill_token": 2e-5}},
           "policy": {"type": "vllm-v1", "max_num_seqs": 8, "max_num_batched_tokens": 256,
                      "num_blocks": 400},
           "workload": {"type": "synthetic", "num_requests": 60,
                        "arrival": {"type": "poisson", "rate": 20},
                        "prompt_len": {"type": "uniform", "low": 10, "high": 600},
                        "output_len": {"type": "uniform", "low": 1, "high": 40}},
           "cluster": {"router": "least_outstanding",
                       "groups": [{"name": "dp", "count": 2, "lockstep": True}]}}
    cfg = Scenario(raw).variants[0]
    arrays = generate_workload(cfg)
    m = build_cluster_model(cfg, arrays, trace_steps=True)
    m.env.run()
    check_cluster_conservation(cfg, m, len(arrays))
    a, b = ([(t0, t1) for _, t0, t1, _ in r.recorder.steps] for r in m.replicas)
    shared = set(a) & set(b)
    assert len(shared) > 20  # both engines busy most of the run
    for x in a:  # a step of one engine is the other's too, or the other took a dummy step
        for y in b:
            assert x == y or x[1] <= y[0] or y[1] <= x[0], (x, y)
    (g,) = m.lockstep
    assert g.num_steps == len(set(a) | set(b))
    assert [x.dummy_steps for x in g.members] == [len(b) - len(shared), len(a) - len(shared)]

"""The vllm-v1 policy in simulated time, its parameters, and the ``orcasim trace`` command."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

import orcasim
import orcasim.steptrace
from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.steptrace import load_workload, read_trace, run_trace

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"
TINY = [{"name": "a", "arrival": 0, "prompt_len": 10, "output_len": 3},
        {"name": "b", "arrival": 0, "prompt_len": 20, "output_len": 2},
        {"name": "c", "arrival": 2, "prompt_len": 5, "output_len": 4}]


def run(requests, latency=None, trace_steps=True, **policy):
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": requests},
        "engine": {"latency": latency or {"type": "linear", "base": 1.0, "per_seq": 0.0,
                                          "per_token": 0.0, "per_prefill_token": 0.5}},
        "policy": {"type": "vllm-v1", **policy},
    })
    return orcasim.simulate(sc, trace_steps=trace_steps)["vllm-v1"]


@pytest.mark.parametrize("async_scheduling,input_lag", [(False, True), (True, False)])
def test_steps_are_charged_by_their_prefill_tokens(async_scheduling, input_lag):
    v = run(TINY, block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16,
            async_scheduling=async_scheduling, input_lag=input_lag)
    # step 1 (t=0): a 10 + b 6 prefill -> 1 + 0.5*16 = 9 s; c arrives at t=2
    # step 2 (t=9): a decodes, b 14 (prefill), c 1 of its 5 (budget) -> 1 + 0.5*15 = 8.5 s
    # step 3 (t=17.5): a, b decode (last tokens), c 4 -> 1 + 0.5*4 = 3 s
    # steps 4-6: c decodes, 1 s each
    assert v.format_steps().splitlines() == [
        "step 1: a | b", "step 2: a | b | c", "step 3: a | b | c", "step 4: c", "step 5: c",
        "step 6: c"]
    df = v.requests.set_index("name")
    assert df["first_token"].to_dict() == {"a": 9.0, "b": 17.5, "c": 20.5}
    assert df["finish"].to_dict() == {"a": 20.5, "b": 20.5, "c": 23.5}
    assert (df["num_output_tokens"] == df["output_len"]).all()
    gaps, counts = v.itl  # a: 8.5, 3; b: 3; c: 1, 1, 1 (bulk or not, every gap once)
    assert sorted(np.repeat(gaps, counts).tolist()) == [1.0, 1.0, 1.0, 3.0, 3.0, 8.5]


def test_under_async_scheduling_an_arrival_during_a_step_waits_for_the_step_after_next():
    # vLLM's engine loop scheduled step 2 when step 1 started (t=0), before c arrived (t=2)
    v = run(TINY, block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16,
            async_scheduling=True)
    # step 1 (t=0): a 10 + b 6 prefill -> 1 + 0.5*16 = 9 s
    # step 2 (t=9): a decodes, b 14 (prefill) -> 1 + 0.5*14 = 8 s
    # step 3 (t=17): a, b decode (last tokens), c 5 -> 1 + 0.5*5 = 3.5 s
    # steps 4-6: c decodes, 1 s each
    assert v.format_steps().splitlines() == [
        "step 1: a | b", "step 2: a | b", "step 3: a | b | c", "step 4: c", "step 5: c",
        "step 6: c"]
    df = v.requests.set_index("name")
    assert df["first_token"].to_dict() == {"a": 9.0, "b": 17.0, "c": 20.5}
    assert df["finish"].to_dict() == {"a": 20.5, "b": 20.5, "c": 23.5}
    gaps, counts = v.itl  # a: 8, 3.5; b: 3.5; c: 1, 1, 1
    assert sorted(np.repeat(gaps, counts).tolist()) == [1.0, 1.0, 1.0, 3.5, 3.5, 8.0]
    # an arrival while the engine is idle is scheduled at once
    w = run([{"name": "a", "arrival": 0, "prompt_len": 10, "output_len": 3},
             {"name": "b", "arrival": 30, "prompt_len": 4, "output_len": 2}],
            block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16,
            async_scheduling=True)
    df = w.requests.set_index("name")
    assert df["first_token"].to_dict() == {"a": 6.0, "b": 33.0}


def test_a_request_that_gives_up_before_the_scheduler_took_it_is_aborted_once():
    # b and c arrive while step 1 (t = 0 to 6) runs; b's client gives up at t=3, before
    # the schedule call that would take it (t=6 for step 3, as step 2 was scheduled at 0)
    v = run([{"name": "a", "arrival": 0, "prompt_len": 10, "output_len": 3},
             {"name": "b", "arrival": 2, "prompt_len": 4, "output_len": 2, "patience": 1.0},
             {"name": "c", "arrival": 3, "prompt_len": 4, "output_len": 2}],
            block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16,
            async_scheduling=True)
    assert v.format_steps().splitlines() == ["step 1: a", "step 2: a", "step 3: a | c",
                                             "step 4: c"]
    df = v.requests.set_index("name")
    assert df["state"].to_dict() == {"a": "finished", "b": "aborted", "c": "finished"}
    assert df.loc["b", "reason"] == "client_timeout" and df.loc["b", "finish"] == 3.0
    assert (df.loc["a", "first_token"], df.loc["c", "first_token"]) == (6.0, 10.0)
    assert np.isnan(df.loc["b", "first_token"])


def test_memory_pressure_preempts_by_recompute_and_everything_finishes():
    sc = orcasim.Scenario({
        "workload": {"type": "synthetic", "num_requests": 200,
                     "arrival": {"type": "poisson", "rate": 40.0},
                     "prompt_len": {"type": "uniform", "low": 50, "high": 400},
                     "output_len": {"type": "uniform", "low": 20, "high": 200}},
        "engine": {"latency": {"type": "linear", "per_prefill_token": 0.0001}},
        "policy": {"type": "vllm-v1", "num_blocks": 120, "max_num_batched_tokens": 512},
        "variants": {"fcfs": {}, "async": {"policy.async_scheduling": True},
                     "priority": {"policy.policy": "priority"}},
    })
    res = orcasim.simulate(sc, seed=3)
    again = orcasim.simulate(sc, seed=3)
    for name, v in res.items():
        df = v.requests
        assert (df["state"] == "finished").all() and len(df) == 200
        assert (df["num_output_tokens"] == df["output_len"]).all()
        assert df["num_preemptions"].sum() > 0, name
        assert v.summary == again[name].summary  # bit for bit


def test_a_request_larger_than_the_pool_is_rejected_with_the_reason():
    v = run([{"name": "big", "prompt_len": 100, "output_len": 30},
             {"name": "ok", "arrival": 1, "prompt_len": 10, "output_len": 2}],
            block_size=16, num_blocks=8)
    df = v.requests.set_index("name")
    assert df.loc["big", "state"] == "rejected"
    assert df.loc["big", "reason"] == "exceeds_kv_capacity"  # needs 9 blocks of 16, has 7
    assert v.summary["rejected_exceeds_kv_capacity"] == 1
    assert df.loc["ok", "state"] == "finished"


@pytest.mark.parametrize("trace_steps", [False, True])
def test_a_misfit_among_simultaneous_arrivals_leaves_the_others_in_arrival_order(trace_steps):
    # one sequence at a time: "late" runs after "first" and before "last", "big" never runs
    v = run([{"name": "first", "prompt_len": 10, "output_len": 2},
             {"name": "big", "prompt_len": 100, "output_len": 30},
             {"name": "late", "prompt_len": 10, "output_len": 2},
             {"name": "last", "prompt_len": 10, "output_len": 2}],
            trace_steps=trace_steps, block_size=16, num_blocks=8, max_num_seqs=1,
            max_num_batched_tokens=16)
    df = v.requests.set_index("name")
    assert df.loc["big", "state"] == "rejected"
    assert df.loc["big", "reason"] == "exceeds_kv_capacity"
    # a 10-token prefill is 1 + 5 s and a decode 1 s: 7 s per request, back to back
    assert df.loc[["first", "late", "last"], "finish"].tolist() == [7.0, 14.0, 21.0]


def test_simulated_time_equals_the_step_clock_when_no_step_is_empty():
    """basic_fcfs never idles: at one second per step the schedule is vLLM's, step for step."""
    wl = json.loads((GOLDEN / "basic_fcfs.json").read_text())
    golden, _ = read_trace(GOLDEN / "basic_fcfs.trace.jsonl")
    reqs = [{"name": r["id"], "arrival": r["arrival_step"], "prompt_len": r["prompt_len"],
             "output_len": r["output_len"]} for r in wl["requests"]]
    v = run(reqs, latency={"type": "constant", "step_time": 1.0}, **wl["config"])
    steps = v.steps
    assert [(int(t0), list(labels)) for _, t0, _, labels in steps] == [
        (line["step"], [e["id"] for e in line["scheduled"]]) for line in golden]


def test_parameters_follow_vllms_config_rules():
    with pytest.raises(ScenarioError) as err:
        run(TINY, enable_chunked_prefill=False, max_num_batched_tokens=512)
    assert str(err.value) == ("<scenario>: policy: without chunked prefill, "
                              "max_num_batched_tokens (512) must be >= max_model_len (8192)")
    with pytest.raises(ScenarioError) as err:
        run(TINY, policy="lifo")
    assert str(err.value) == ("<scenario>: policy.policy: Input should be 'fcfs' or 'priority' "
                              "(got 'lifo')")


def write(tmp_path, data, name="w.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_trace_command_writes_the_harness_schema(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    rc = main(["trace", str(GOLDEN / "tiny.json"), "--out", str(out),
               "--compare", str(GOLDEN / "tiny.trace.jsonl")])
    assert rc == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("6/6 steps identical")
    lines, summary = read_trace(out)
    assert list(lines[2]) == ["step", "arrivals", "scheduled", "num_batched_tokens", "preempted",
                              "running", "waiting", "free_blocks_after_schedule",
                              "cached_blocks", "finished", "free_blocks_after_update"]
    assert summary["finish_step"] == {"a": 2, "b": 2, "c": 5}


@pytest.mark.parametrize("data, message", [
    ('{"requests": [', "w.json: line 1: invalid JSON: Expecting value"),
    ({"requests": [{"id": "a", "arrival_step": 0, "prompt_len": 4}]},
     "w.json: requests[0].output_len: required field is missing"),
    ({"requests": [{"id": "a", "arrival_step": -1, "prompt_len": 4, "output_len": 1}]},
     "w.json: requests[0].arrival_step: Input should be greater than or equal to 0 (got -1)"),
    ([{"id": "a", "arrival_step": 0, "prompt_len": 4, "output_len": 1},
      {"id": "a", "arrival_step": 0, "prompt_len": 4, "output_len": 1}],
     "w.json: requests[1].id: duplicate request id 'a'"),
    ({"config": {"block_sise": 8}, "requests": []}, "w.json: config.block_sise: unknown key"),
    ({"config": {"policy": "lifo"}, "requests": [{"id": "a", "arrival_step": 0,
                                                  "prompt_len": 4, "output_len": 1}]},
     "w.json: config.policy: Input should be 'fcfs' or 'priority'"),
    ({"config": {"num_blocks": 4}, "requests": [{"id": "a", "arrival_step": 0,
                                                 "prompt_len": 60, "output_len": 1}]},
     "w.json: requests[0] (id 'a'): can never run: needs 4 KV blocks of 16 tokens, the pool has 3"),
    ({"requests": []}, "w.json: requests: expected a non-empty list of requests"),
])
def test_trace_command_names_the_bad_field(tmp_path, capsys, data, message):
    p = write(tmp_path, data)
    rc = main(["trace", str(p), "--out", str(tmp_path / "t.jsonl")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"orcasim: error: {tmp_path / message}"), err


GOLDEN_WORKLOADS = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", GOLDEN_WORKLOADS, ids=lambda p: p.stem)
def test_golden_workloads_finish_in_simulated_time(path):
    """Without the step clock, empty schedule calls take no time; every request still ends."""
    from orcasim.steptrace import load_workload

    wl = load_workload(path)
    params = wl.params.model_dump(exclude={"empty_steps"})
    reqs = [{"name": str(r.id), "arrival": r.arrival_step, "prompt_len": r.prompt_len,
             "output_len": r.output_len, "priority": r.priority,
             "prefix_id": None if r.prefix_id is None else str(r.prefix_id),
             "prefix_len": r.prefix_len} for r in wl.requests]
    v = run(reqs, latency={"type": "constant", "step_time": 1.0}, trace_steps=False, **params)
    df = v.requests
    assert (df["state"] == "finished").all() and len(df) == len(reqs)
    room = (params["max_model_len"] - df["prompt_len"]).clip(lower=1)
    assert (df["num_output_tokens"] == np.minimum(df["output_len"], room)).all()
    cut = df["num_output_tokens"] < df["output_len"]  # stopped by a full context
    assert (df.loc[cut, "reason"] == "max_model_len").all()
    assert df.loc[~cut, "reason"].isna().all()
    assert v.summary.get("truncated_max_model_len", 0) == int(cut.sum())
    golden, _ = read_trace(path.with_suffix(".trace.jsonl"))
    assert v.summary["num_steps"] <= len(golden)


def test_a_stuck_run_is_an_error_not_a_hang(monkeypatch):
    from orcasim.policies.vllm_v1 import schedule

    monkeypatch.setattr(schedule, "misfit", lambda *a: None)  # let a too-large one in
    with pytest.raises(orcasim.SimulationError) as err:
        run([{"name": "big", "prompt_len": 100, "output_len": 30}], block_size=16, num_blocks=8)
    # prefill 100 tokens (51 s), decode until its 7 blocks are full (12 s), preempt itself,
    # and never fit again
    assert str(err.value) == ("policy 'vllm-v1' cannot schedule request big at t=63: nothing "
                              "is in flight and nothing fits")


def test_a_request_cut_at_max_model_len_finishes_with_that_reason():
    v = run([{"name": "long", "prompt_len": 15, "output_len": 10},
             {"name": "fits", "prompt_len": 5, "output_len": 3},
             {"name": "too_long", "prompt_len": 21, "output_len": 1}],
            max_model_len=20, max_num_batched_tokens=32, max_num_seqs=4, block_size=4,
            num_blocks=32)
    df = v.requests.set_index("name")
    # the context holds 20 tokens: 15 of prompt and 5 generated
    assert df.loc["long", "state"] == "finished" and df.loc["long", "num_output_tokens"] == 5
    assert df.loc["long", "reason"] == "max_model_len"
    assert df.loc["fits", "num_output_tokens"] == 3 and df["reason"].isna()["fits"]
    assert df.loc["too_long", "reason"] == "exceeds_max_model_len"
    s = v.summary
    assert s["truncated_max_model_len"] == 1 and s["rejected_exceeds_max_model_len"] == 1


def test_pool_sizes_are_bounded_so_nothing_runs_for_ever(tmp_path, capsys):
    import json

    w = json.loads((GOLDEN / "mixed_0.json").read_text())
    w["config"].update(num_blocks=10**12, max_model_len=10**12)
    p = tmp_path / "w.json"
    p.write_text(json.dumps(w))
    assert main(["trace", str(p), "--out", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "config.num_blocks: Input should be less than or equal to 10000000" in err
    with pytest.raises(orcasim.ScenarioError, match=r"memory\.num_blocks: .*less than or equal"):
        orcasim.Scenario({"workload": {"type": "list", "requests": [{"prompt_len": 1,
                                                                      "output_len": 1}]},
                          "policy": "fcfs", "memory": {"num_blocks": 10**9}})


def test_a_step_trace_collects_young_objects_less_often_and_puts_the_thresholds_back():
    seen = []
    workload = load_workload(Path(__file__).parent / "golden" / "vllm_v1" / "tiny.json")
    before = gc.get_threshold()
    writer_scheduled = orcasim.steptrace.TraceWriter.scheduled

    def spy(self, policy, out):
        seen.append(gc.get_threshold())
        return writer_scheduled(self, policy, out)

    orcasim.steptrace.TraceWriter.scheduled = spy  # type: ignore[method-assign]
    try:
        lines, _ = run_trace(workload)
    finally:
        orcasim.steptrace.TraceWriter.scheduled = writer_scheduled  # type: ignore[method-assign]
    assert len(seen) == len(lines) and seen[0] == (50_000, *before[1:])
    assert gc.get_threshold() == before

"""Step-clock trace runs: what a run shares between runs and leaves behind.

A workload's request columns are made once and shared by its runs (rebuilt
when its request list changes); lines do not share lists with one another or
with the writer (a line's running and waiting lists are copies even when the
writer reuses their labels); the collector's thresholds are put back.
"""

from __future__ import annotations

import gc
from itertools import pairwise
from pathlib import Path

from orcasim.steptrace import load_workload, run_trace

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"


def test_runs_of_one_workload_are_equal_and_share_its_columns():
    workload = load_workload(GOLDEN / "pressure_fcfs_async.json")
    first = workload.arrays()
    assert workload.arrays() is first
    lines, summary = run_trace(workload)
    again, summary2 = run_trace(workload)
    assert again == lines
    summary.pop("loop_wall_s"), summary.pop("ms_per_step")
    summary2.pop("loop_wall_s"), summary2.pop("ms_per_step")
    assert summary2 == summary
    workload.requests = workload.requests[:3]  # another request list: columns made anew
    assert len(workload.arrays().arrival) == 3


def test_lines_share_no_lists():
    lines, _ = run_trace(load_workload(GOLDEN / "pressure_fcfs.json"))
    for key in ("running", "waiting"):
        ids = [id(line[key]) for line in lines]
        assert len(set(ids)) == len(ids), key
    same = [a for a, b in pairwise(lines) if a["running"] == b["running"]]
    assert same  # labels reused: the lists are still separate
    lines[0]["running"].append("x")
    assert "x" not in lines[1]["running"]


def test_the_collector_thresholds_are_put_back():
    before = gc.get_threshold()
    run_trace(load_workload(GOLDEN / "tiny.json"))
    assert gc.get_threshold() == before


def test_a_step_trace_leaves_nothing_frozen_and_keeps_what_others_froze():
    run_trace(load_workload(GOLDEN / "tiny.json"))
    assert gc.get_freeze_count() == 0  # the run's objects went to the oldest generation
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        run_trace(load_workload(GOLDEN / "tiny.json"))
        # not thawed by the run (that would leave none) and nothing of its own added; a
        # thread another test left running may free a few of the frozen objects meanwhile
        assert frozen - 100 <= gc.get_freeze_count() <= frozen
        assert frozen > 1_000
        assert gc.get_threshold()[0] != 50_000
    finally:
        gc.unfreeze()

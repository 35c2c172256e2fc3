"""Conformance: the vllm-v1 policy's step traces equal vLLM 0.33.0's, line for line.

The golden traces in tests/golden/vllm_v1 were written by the oracle harness,
which drives vLLM's own V1 scheduler (see docs/vllm-v1.md): the harness's six
examples, copied verbatim, and random workloads from make_workloads.py. Each
workload runs on orcasim's step clock and every field of every line must match
(block ids too, where the golden trace lists them), as must the summary's per-request
finish and first-token steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orcasim.policies.vllm_v1 import VllmV1
from orcasim.steptrace import (
    first_difference,
    load_workload,
    read_trace,
    run_trace,
    summarize_trace,
)

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"
TRACES = sorted(GOLDEN.glob("*.trace.jsonl"))
EXAMPLES = ["basic_fcfs", "pressure_fcfs", "pressure_fcfs_async", "priority_prefix",
            "same_step_prefix", "tiny"]


def name_of(path: Path) -> str:
    return path.name.removesuffix(".trace.jsonl")


def test_the_golden_set_is_complete():
    names = {name_of(p) for p in TRACES}
    assert set(EXAMPLES) <= names
    assert len(names - set(EXAMPLES)) >= 20  # random workloads beyond the harness's examples
    for p in TRACES:
        assert (GOLDEN / f"{name_of(p)}.json").is_file()


@pytest.mark.parametrize("trace", TRACES, ids=name_of)
def test_trace_equals_vllm(trace: Path):
    golden, summary = read_trace(trace)
    assert golden and summary is not None
    block_tables = any("blocks" in e for line in golden for e in line["scheduled"])
    lines, ours = run_trace(load_workload(GOLDEN / f"{name_of(trace)}.json"),
                            block_tables=block_tables)
    diff = first_difference(lines, golden)
    assert diff is None, f"{name_of(trace)}: {diff}"
    for key in ("last_step", "num_engine_steps", "num_preemptions", "finish_step",
                "first_token_step"):
        assert ours[key] == summary[key], key


@pytest.mark.parametrize("trace", TRACES, ids=name_of)
def test_the_writers_summary_is_the_one_made_from_the_lines(trace: Path):
    workload = load_workload(GOLDEN / f"{name_of(trace)}.json")
    lines, ours = run_trace(workload)
    ref = summarize_trace(lines, workload, ours["loop_wall_s"])
    ref["ms_per_step"] = ours["ms_per_step"]  # (from the unrounded wall time)
    assert list(ours.items()) == list(ref.items())
    for key in ("finish_step", "first_token_step"):  # in the same order too
        assert list(ours[key].items()) == list(ref[key].items())


@pytest.mark.parametrize("trace", TRACES, ids=name_of)
def test_plans_by_sizes_have_the_sizes_of_the_listed_plans(trace: Path, monkeypatch):
    """A step trace's plans carry only their sizes (``plans_by_sizes``): the same sizes, step
    for step, as the plans that list their requests and contexts, and the same trace."""
    workload = load_workload(GOLDEN / f"{name_of(trace)}.json")
    plan_of = VllmV1._plan
    runs = {}
    for by_sizes in (True, False):
        sizes = []

        def plan(self, out, by_sizes=by_sizes, sizes=sizes):
            self.plans_by_sizes = by_sizes
            p = plan_of(self, out)
            assert (p.scheduled is None) == by_sizes
            if p.scheduled is not None:
                assert p.num_seqs == len(p.scheduled) and p.num_kv_tokens == sum(p.contexts)
            sizes.append((p.num_seqs, p.num_kv_tokens, p.num_prefill_tokens,
                          p.num_decode_tokens, p.num_singles))
            return p

        monkeypatch.setattr(VllmV1, "_plan", plan)
        lines, summary = run_trace(workload)
        del summary["loop_wall_s"], summary["ms_per_step"]
        runs[by_sizes] = (sizes, lines, summary)
    assert runs[True] == runs[False]
    assert len(runs[True][0]) == len(runs[True][1])  # a plan for every schedule call


def test_first_difference_names_the_step_and_field():
    a = [{"step": 0, "scheduled": [], "running": ["x"]}, {"step": 1, "running": ["x", "y"]}]
    b = [{"step": 0, "scheduled": [], "running": ["x"]}, {"step": 1, "running": ["y", "x"]}]
    assert first_difference(a, a) is None
    assert first_difference(a, b) == 'step 1: running = ["x", "y"] want ["y", "x"]'
    assert first_difference(a[:1], b) == "1 steps, want 2"

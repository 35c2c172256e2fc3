"""Workload rows that a preemption keeps as rows in the KV loop, and the growth's count of
covered rounds, against the paths they stand for.

:class:`~orcasim.policies.kv_loop.KVDecodeLoop` keeps a row preempted by recompute as a row in
front of the queue, admits it again as a row and writes its request's row (preemptions
included) from it; ``tests/test_kv_loop.py`` compares whole runs with the policy's runs and
step-by-step simulation. Here: those rows occur and are written both ways the recorder
writes rows, :meth:`~orcasim.sched.decode_growth.DecodeGrowth.covered` equals the
per-round count, and the memory series' runs held whole bin as runs added one by one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from orcasim.metrics.kv_series import BUFFER as KV_BUFFER
from orcasim.metrics.kv_series import KVSeries
from orcasim.metrics.request_rows import ROW_PREEMPTIONS, RequestRows
from orcasim.sched.decode_growth import DecodeGrowth
from tests.test_kv_loop import SCENARIOS, assert_three_identical, run_three


@pytest.mark.parametrize("watch", [None, 5.0])
def test_preempted_rows_are_written_with_their_preemptions(monkeypatch, watch):
    """Without hand-backs the preempted rows finish among rows (written by column); with a
    process waking now and then, some finish among requests made at a hand-back."""
    written = {"indexed": 0, "mixed": 0}
    indexed, mixed = RequestRows._write_indexed, RequestRows._write_mixed

    def count(kind, rows):
        written[kind] += sum(type(r) is list and len(r) > ROW_PREEMPTIONS for r in rows)

    def spy_indexed(self, rows):
        count("indexed", rows)
        indexed(self, rows)

    def spy_mixed(self, chunk, row):
        count("mixed", chunk)
        mixed(self, chunk, row)

    monkeypatch.setattr(RequestRows, "_write_indexed", spy_indexed)
    monkeypatch.setattr(RequestRows, "_write_mixed", spy_mixed)
    out = run_three(SCENARIOS["tight"], n=1500, watch=watch)
    assert_three_identical(out)
    if watch is None:
        assert written["indexed"] > 100
    else:
        assert written["mixed"] > 0
    cols = out["loop"]["columns"]
    assert int(np.sum(cols["num_preemptions"])) == out["loop"]["preemptions"]["num_preemptions"]


class _Alloc:
    """What :class:`DecodeGrowth` reads of an allocator."""

    def __init__(self, bs: int) -> None:
        self.block_size = bs
        self.num_free_blocks = 0

    class layout:
        num_blocks = 10**6


def _per_round(g: DecodeGrowth, step: int, limit: int) -> int:
    free = g.alloc.num_free_blocks
    for j in range(limit):
        free -= len(g.phases[(step + 1 + j) % g.bs])
        if free < 0:
            return j
    return limit


@pytest.mark.parametrize("bs", [1, 2, 4, 16])
def test_covered_equals_the_rounds_counted_one_by_one(bs):
    rng = random.Random(bs)
    checked = 0
    for _ in range(3000):
        g = DecodeGrowth(_Alloc(bs))  # type: ignore[arg-type]
        for phase in g.phases:
            for _ in range(rng.randrange(4)):
                phase[rng.randrange(1000)] = 0
        members = sum(map(len, g.phases))
        g._plan = dict.fromkeys(range(members + rng.randrange(3)))  # type: ignore[arg-type]
        g.alloc.num_free_blocks = rng.randrange(40)
        step, limit = rng.randrange(100), rng.randrange(3 * bs + 5)
        if limit and len(g.phases[(step + 1) % bs]) > g.alloc.num_free_blocks:
            continue  # (the next round is not covered: the caller takes it exactly)
        assert g.covered(step, limit) == _per_round(g, step, limit), (step, limit)
        checked += 1
    assert checked > 1000


def test_kv_series_held_runs_equal_runs_added_one_by_one():
    """Runs held whole (:meth:`KVSeries.hold_run`), some added as runs or steps between them
    and read in between, bin exactly as the same runs added with ``add_run``."""
    rng = np.random.default_rng(5)
    added, held = KVSeries(capacity=64, total=10_000), KVSeries(capacity=64, total=10_000)
    t, tokens, steps = 0.0, 100, 0
    while steps < 3 * KV_BUFFER + 91:
        k = int(rng.integers(1, 40))
        size, padding, swapped = int(rng.integers(0, 33)), int(rng.integers(0, 9)), steps % 5
        blocked = bool(rng.integers(0, 2))
        ends = [float(x) for x in t + np.cumsum(rng.uniform(0.001, 0.01, k))]
        alloc = [int(a) for a in rng.integers(0, 10_000, k)]
        internal = [int(a) for a in rng.integers(0, 50, k)]
        run = (t, ends, tokens, size, alloc, internal, padding, swapped, blocked)
        added.add_run(*run)
        how = int(rng.integers(0, 10))
        if how == 0:
            held.add_run(*run)
        elif how == 1 and k == 1:
            held.add(t, ends[0], tokens, alloc[0], internal[0], padding, swapped, blocked)
        else:
            held.hold_run(run)
        if how == 2:
            assert len(held) == len(added)
        t, tokens, steps = ends[-1], tokens + size * k + 3, steps + k
    a, b = added.rows(), held.rows()
    assert a["num_steps"].sum() == steps
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert added.totals() == held.totals()

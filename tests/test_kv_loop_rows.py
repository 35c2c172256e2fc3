"""Workload rows that a preemption keeps as rows in the KV loop, and the growth's count of
covered rounds, against the paths they stand for.

:class:`~orcasim.policies.kv_loop.KVDecodeLoop` keeps a row preempted by recompute as a row in
front of the queue, admits it again as a row and writes its request's row (preemptions
included) from it; ``tests/test_kv_loop.py`` compares whole runs with the policy's runs and
step-by-step simulation. Here: those rows occur and are written both ways the recorder
writes rows, and :meth:`~orcasim.sched.decode_growth.DecodeGrowth.covered` equals the
per-round count.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

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

"""The bins' sums of the bounded series are ``numpy.add.reduceat``'s, bit for bit."""

import numpy as np
import pytest

from orcasim.metrics import group_sums as gs
from orcasim.metrics.series import BinnedSeries, merge_rows, rebin


def _rows(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    scale = rng.choice([1e-9, 1e-3, 1.0, 7.5e4, 3e9], size=(n, width))
    return rng.random((n, width)) * scale


def test_the_emulated_sums_match_reduceat_here():
    assert gs._matches_reduceat()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 24, 33, 64, 65, 128, 129,
                                  130, 300])
def test_equal_bins_are_reduceats(size):
    rng = np.random.default_rng(size)
    a = _rows(rng, 6 * size, 9)
    starts = np.arange(0, len(a), size)
    np.testing.assert_array_equal(gs.group_sums(a, starts), np.add.reduceat(a, starts, axis=0))


@pytest.mark.parametrize("lengths", [
    [3] + [8] * 500 + [5],  # a partial row's bin, whole bins, a partial last one
    [2] * 300 + [5] + [16] * 200 + [1],  # old rows in pairs, then raw steps (a rebin)
    [1] * 40,
    [7],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],  # irregular: reduceat itself
    [64] * 3 + [200] * 2,
])
def test_any_bins_are_reduceats(lengths):
    rng = np.random.default_rng(len(lengths))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    a = _rows(rng, int(sum(lengths)), 11)
    np.testing.assert_array_equal(gs.group_sums(a, starts), np.add.reduceat(a, starts, axis=0))


def test_merged_rows_are_those_of_reduceat_per_field():
    rng = np.random.default_rng(7)
    n = 4100
    steps = np.ones(n)
    steps[0] = 3.0  # a partial bin from before, then raw steps
    agg = {"t_start": np.cumsum(rng.random(n)), "num_steps": steps, "busy": rng.random(n),
           "a_dt": _rows(rng, n, 1)[:, 0], "b_dt": rng.random(n) * 1e6}
    agg["t_end"] = agg["t_start"] + agg["busy"]
    got = merge_rows(agg, 8, 5)
    start = np.concatenate([[0.0], np.cumsum(steps)[:-1]]) + 5
    group = (start // 8).astype(np.int64)
    first = np.flatnonzero(np.diff(group, prepend=-1))
    last = np.concatenate([first[1:], [n]]) - 1
    for f, col in agg.items():
        want = (col[first] if f == "t_start" else col[last] if f == "t_end"
                else np.add.reduceat(col, first))
        np.testing.assert_array_equal(got[f], want, err_msg=f)


def test_a_numpy_that_sums_otherwise_takes_reduceat(monkeypatch):
    monkeypatch.setattr(gs, "_matches_reduceat", lambda: False)
    monkeypatch.setattr(gs, "_equal_bins", None)  # never called
    rng = np.random.default_rng(2)
    a = _rows(rng, 64, 4)
    starts = np.arange(0, 64, 8)
    np.testing.assert_array_equal(gs.group_sums(a, starts), np.add.reduceat(a, starts, axis=0))


def _reference_merge(agg: dict, width: int, first: int) -> dict:
    """Rows merged into bins of ``width`` steps with ``numpy.add.reduceat`` field by field."""
    start = np.concatenate([[0.0], np.cumsum(agg["num_steps"])[:-1]]) + first
    group = (start // width).astype(np.int64)
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = np.concatenate([starts[1:], [len(group)]]) - 1
    return {f: a[starts] if f == "t_start" else a[ends] if f == "t_end"
            else np.add.reduceat(a, starts) for f, a in agg.items()}


class ReduceatTail(BinnedSeries):
    """The series merging its last rows with the new steps by concatenation and reduceat."""

    def add_columns(self, t0, t1, columns):
        dt = t1 - t0
        raw = {"t_start": t0, "t_end": t1, "num_steps": np.ones_like(t0), "busy": dt}
        for v, col in zip(self.values, columns, strict=True):
            raw[f"{v}_dt"] = col * dt
        old = self._agg
        n = len(old["num_steps"])
        done = int(old["num_steps"].sum())
        if n and self.width > 1 and (done + len(t0) - 1) // self.width < self.capacity:
            keep = n if done % self.width == 0 else n - 1
            first = done - int(old["num_steps"][keep:].sum())
            tail = {f: np.concatenate([old[f][keep:], raw[f]]) for f in self._fields}
            tail = _reference_merge(tail, self.width, first)
            self._agg = {f: np.concatenate([old[f][:keep], tail[f]]) for f in self._fields}
            return
        agg = {f: np.concatenate([old[f], raw[f]]) for f in self._fields}
        self._agg, self.width = rebin(agg, self.width, self.capacity)


@pytest.mark.parametrize("capacity,blocks", [
    (4096, [4096] * 8),  # the memory series' blocks: bins of 2, 4 and 8 steps
    (16, [3, 16, 5, 1, 16, 16, 7, 30, 2, 100, 1, 1] * 6),  # bins left partial between blocks
    (64, [64] * 70),  # wide bins: reduceat itself
])
def test_the_new_bins_alone_are_the_merge_by_reduceat(capacity, blocks):
    rng = np.random.default_rng(11)
    values = ("a", "b", "c", "d", "e", "f", "g")
    quick, ref = BinnedSeries(values, capacity), ReduceatTail(values, capacity)
    t = 0.0
    for size in blocks:
        t1 = t + np.cumsum(rng.exponential(0.01, size))
        t0 = np.concatenate([[t], t1[:-1]])
        cols = [rng.integers(0, 10**6, size).astype(float) for _ in values]
        quick.add_columns(t0, t1, cols)
        ref.add_columns(t0, t1, cols)
        t = t1[-1]
        assert quick.width == ref.width
        for f, a in ref._agg.items():
            np.testing.assert_array_equal(quick._agg[f], a, err_msg=f)
    assert quick.width > 2

"""The bins' sums of the bounded series are ``numpy.add.reduceat``'s, bit for bit."""

import numpy as np
import pytest

from orcasim.metrics import group_sums as gs
from orcasim.metrics.series import merge_rows


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

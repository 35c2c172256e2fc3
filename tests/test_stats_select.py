"""Weighted percentiles found in radix passes equal those found by sorting, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.metrics import stats

QS = (0, 1, 25, 50, 90, 99, 99.9, 100)


def _samples(kind: int, rng: np.random.Generator) -> np.ndarray:
    n = 30_000
    if kind == 0:  # step gaps: a few batch sizes, each with float noise
        return 0.02 + rng.integers(0, 32, n) * 0.0008 + rng.random(n) * 1e-9
    if kind == 1:  # many ties, both signs
        return np.round(rng.normal(0.5, 1, n), 2) + 0.001
    return np.concatenate([rng.lognormal(-3, 2, n // 2), -rng.lognormal(0, 3, n // 2)])


@pytest.mark.parametrize("kind", [0, 1, 2])
@pytest.mark.parametrize("gather", [0, 16, 1 << 16])
def test_radix_selection_equals_sorting(kind, gather, monkeypatch):
    rng = np.random.default_rng(kind)
    values = _samples(kind, rng)
    counts = rng.integers(0, 40, values.size).astype(np.int32)
    monkeypatch.setattr(stats, "SELECT_ABOVE", 10**12)
    by_sort = stats.weighted_percentiles(values, counts, QS)
    monkeypatch.setattr(stats, "SELECT_ABOVE", 0)
    monkeypatch.setattr(stats, "_GATHER", gather)  # 0: every pass counts, down to the last bits
    monkeypatch.setattr(stats, "_CHUNK", 4096)
    by_radix = stats.weighted_percentiles(values, counts, QS)
    assert [x.hex() for x in by_radix] == [x.hex() for x in by_sort]
    np.testing.assert_array_equal(by_radix, np.percentile(np.repeat(values, counts), QS))


def test_a_negative_zero_is_left_to_the_sort(monkeypatch):
    values = np.array([-0.0, 0.0, 1.0, -0.0])
    monkeypatch.setattr(stats, "SELECT_ABOVE", 0)
    assert not stats._selectable(values) and stats._selectable(np.abs(values) + 1)
    got = stats.weighted_percentiles(values, np.array([1, 1, 1, 1]), [0, 50])
    assert [x.hex() for x in got] == [x.hex() for x in np.percentile(values, [0, 50])]

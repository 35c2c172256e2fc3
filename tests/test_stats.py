"""Exact weighted percentiles: equal to numpy on the expanded sample."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from orcasim.metrics.stats import percentiles, weighted_mean, weighted_percentiles


@given(
    st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(0, 6)), min_size=1,
             max_size=50),
    st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_weighted_percentiles_equal_numpy_on_expanded(pairs, qs):
    v = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs])
    got = weighted_percentiles(v, c, qs)
    if c.sum() == 0:
        assert all(np.isnan(got))
        return
    expanded = np.repeat(v, c)
    assert got == [float(x) for x in np.percentile(expanded, qs)]
    assert weighted_mean(v, c) == float(np.dot(v, c) / c.sum())


def test_percentiles_ignore_nan_and_handle_empty():
    assert percentiles(np.array([np.nan, 1.0, 3.0]), [50]) == [2.0]
    assert np.isnan(percentiles(np.array([np.nan]), [50])[0])


def test_weighted_percentiles_past_two_billion_tokens():
    # running counts beyond 32 bits: three gaps of 1.0, then 2**31 gaps of 2.0
    values = np.array([2.0, 1.0])
    counts = np.array([2**31, 3])
    assert weighted_percentiles(values, counts, [0, 50, 100]) == [1.0, 2.0, 2.0]
    n = 2**31 + 3  # rank 2 is the last 1.0, rank 3 the first 2.0
    q = 100 * 2.5 / (n - 1)
    assert weighted_percentiles(values, counts, [q]) == [1.5]

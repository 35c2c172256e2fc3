"""The memory series' allocated values counted in blocks (``KVDecodeLoop``'s runs) against
the same values counted in slots (``KVSeries.add_run``, ``KVPool.observe_run``)."""

from __future__ import annotations

import numpy as np

from orcasim.metrics.kv_series import _BUFFER, KVSeries


def test_runs_counted_in_blocks_bin_as_in_slots():
    """Runs whose allocated values are blocks with the block size as their unit, mixed with
    runs in slots, give the rows and totals of every run in slots, across flushes that cut
    a run in two."""
    rng = np.random.default_rng(11)
    bs = 16
    slots, blocks = KVSeries(capacity=64, total=400 * bs), KVSeries(capacity=64, total=400 * bs)
    t, tokens, steps = 0.0, 100, 0
    while steps < 3 * _BUFFER + 91:
        k = int(rng.integers(1, 40))
        size, padding, swapped = int(rng.integers(0, 33)), int(rng.integers(0, 9)), steps % 5
        blocked = bool(rng.integers(0, 2))
        ends = [float(e) for e in t + np.cumsum(rng.uniform(0.001, 0.01, k))]
        used = [int(a) for a in np.cumsum(rng.integers(0, 4, k)) + rng.integers(0, 300)]
        internal = [int(a) for a in rng.integers(0, 50, k)]
        slots.add_run(t, ends, tokens, size, [u * bs for u in used], internal, padding,
                      swapped, blocked)
        if rng.integers(0, 4):  # as KVDecodeLoop writes a run: blocks, the block size as unit
            blocks._t1 += ends
            blocks._alloc += used
            blocks._int += internal
            blocks._t0.append(t)
            blocks._runs.extend((k, tokens, size, padding, swapped, blocked, bs))
            if len(blocks) >= _BUFFER:
                blocks.flush(whole=True)
        else:
            blocks.add_run(t, ends, tokens, size, [u * bs for u in used], internal, padding,
                           swapped, blocked)
        t, tokens, steps = ends[-1], tokens + size * k + 3, steps + k
    a, b = slots.rows(), blocks.rows()
    assert a["num_steps"].sum() == steps
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert slots.totals() == blocks.totals()


def test_a_run_row_without_its_unit_is_refused():
    """A writer of the run's row without its unit field fails loudly at the flush instead
    of shifting every later field."""
    import pytest

    s = KVSeries(capacity=8, total=100)
    s._t1 += [1.0, 2.0]
    s._alloc += [3, 4]
    s._int += [0, 0]
    s._t0.append(0.0)
    s._runs.extend((2, 10, 1, 0, 0, False))  # six fields: no unit
    with pytest.raises(ValueError, match="run fields"):
        s.flush()

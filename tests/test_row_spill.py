"""Request rows streamed to disk during a run give the same outputs as rows held in memory."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest

import orcasim
from orcasim.metrics import row_spill
from orcasim.metrics.row_spill import RowSpill, SpilledColumns
from orcasim.simulation import simulate

CLASSES = [{"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
           {"name": "batch", "weight": 2, "priority": 1}]


def _scenario() -> orcasim.Scenario:
    """Classes and tenants, preemption (requests end far out of id order), a hard stop
    (aborted, with reasons), and a variant with the front end (an extra ``sent`` column)."""
    return orcasim.Scenario({
        "workload": {"type": "synthetic", "num_requests": 240,
                     "arrival": {"type": "poisson", "rate": 40.0},
                     "output_len": {"type": "lognormal", "mu": 3.0, "sigma": 0.9, "min": 2,
                                    "max": 200},
                     "prompt_len": {"type": "lognormal", "mu": 3.0, "sigma": 0.7, "min": 5,
                                    "max": 300},
                     "classes": CLASSES},
        "engine": {"latency": {"type": "linear", "base": 0.005, "per_seq": 0.0008,
                               "per_token": 0.00002}},
        "policy": {"type": "priority", "max_batch": 8, "preempt": True},
        "events": [{"type": "hard_stop", "at": 4.0}],
        "variants": {"priority": {}, "continuous": {"policy": {"type": "continuous"}},
                     "front": {"engine": {"frontend": {"request_s": 0.001,
                                                       "per_prompt_token_s": 0.0001,
                                                       "per_output_s": 0.002}}}},
    })


_waited: list[int] = []  # rows pending after each block handed to a spill


def _run(tmp_path, name: str, stream: bool, monkeypatch) -> orcasim.Results:
    if stream:  # every run streams, in blocks of 7 rows: many row groups, many pending rows
        monkeypatch.setattr(row_spill, "STREAM_ABOVE", 0)
        monkeypatch.setattr(row_spill, "SPILL_ROWS", 7)
        add = RowSpill.add

        def watched(spill: RowSpill, block: dict) -> None:
            add(spill, block)
            _waited.append(0 if spill._pending is None else len(spill._pending["id"]))

        monkeypatch.setattr(RowSpill, "add", watched)
    res = simulate(_scenario())
    monkeypatch.undo()
    res.add_percentiles([95, 99.9])
    res.write(tmp_path / name, plots=False, requests_csv=True)
    return res


def test_streamed_rows_equal_rows_held_in_memory(tmp_path, monkeypatch):
    _waited.clear()
    held = _run(tmp_path, "held", False, monkeypatch)
    streamed = _run(tmp_path, "streamed", True, monkeypatch)
    assert all(isinstance(v.columns, dict) for v in held.values())
    assert all(isinstance(v.columns, SpilledColumns) for v in streamed.values())
    for f in ("summary.json", "requests.csv", "requests.parquet", "summary_long.csv"):
        assert (tmp_path / "held" / f).read_bytes() == (tmp_path / "streamed" / f).read_bytes(), f
    a, b = held.requests, streamed.requests
    assert a.equals(b) and len(a) == 720
    assert set(a["state"]) == {"finished", "aborted", "rejected"} and a["reason"].notna().any()
    assert a["cls"].notna().all() and a["tenant"].notna().any() and a["sent"].notna().any()
    for name, v in streamed.items():
        w = held[name]
        assert list(v.columns) == list(w.columns)
        for k in w.columns:
            x, y = v.columns[k], w.columns[k]
            if isinstance(y, np.ndarray):
                np.testing.assert_array_equal(x, y, err_msg=k)
            else:
                assert list(x) == list(y), k
        assert v.first_requests(10).equals(w.first_requests(10))
        assert pickle.loads(pickle.dumps(v.columns)).keys() == w.columns.keys()
        groups = pq.ParquetFile(v.columns.path).num_row_groups
        assert groups > 20  # the rows went to disk a few at a time during the run
    assert max(_waited) > 7  # requests ended out of id order: rows waited for smaller ids


def test_rows_wait_until_every_smaller_id_has_ended():
    spill = RowSpill()

    def block(ids):
        n = len(ids)
        return {"id": np.array(ids), **{c: np.zeros(n, np.int64) for c in row_spill.INT_COLUMNS
                                        if c != "id"},
                **{c: np.arange(n, dtype=float) for c in row_spill.FLOAT_COLUMNS},
                **{c: np.full(n, None, object) for c in row_spill.STRING_COLUMNS}}

    spill.add(block([2, 0, 4]))
    assert spill.num_written == 1 and spill.num_rows == 3  # 0 written; 2 and 4 wait for 1, 3
    spill.add(block([1, 3]))
    assert spill.num_written == 5 and spill.num_distinct_ids() == 5
    spill.add(block([3, 9]))  # 3 again (a bookkeeping error the run reports), 9 waits
    assert spill.num_distinct_ids() == 6
    cols = spill.finish()
    assert cols.num_rows == 7
    assert cols["id"].tolist() == [0, 1, 2, 3, 4, 3, 9]  # the rest in id order at the end
    path = cols.path
    del cols, spill
    assert not path.exists()  # the file goes with the results


def test_streamed_columns_are_taken_once():
    from orcasim.metrics.recorder import Recorder
    from orcasim.request import Request, RequestState

    rec = Recorder(spill_rows=2)
    for i in (1, 0, 2):
        req = Request(i, 0.0, 3, 2)
        req.state = RequestState.FINISHED
        rec.record_request(req)
    assert rec.state_counts()[RequestState.FINISHED] == 3 and rec.num_distinct_ids() == 3
    with pytest.raises(ValueError, match="streamed to disk"):
        rec.request_columns()
    cols = rec.request_columns(take=True)
    assert cols["id"].tolist() == [0, 1, 2] and rec.num_recorded == 3

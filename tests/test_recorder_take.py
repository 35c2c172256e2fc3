"""The recorder hands its request rows over at the run's end (held once, not twice)."""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.simulation import build_model, generate_workload


def _ran(n: int = 300):
    sc = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": n, "memory": {"block_size": 16, "num_blocks": 60}})
    cfg = sc.variant("continuous")
    m = build_model(cfg, generate_workload(cfg))
    m.env.run()
    return m.recorder


def test_taken_columns_equal_read_ones_and_the_rows_leave():
    rec = _ran()
    read = rec.request_columns()
    held = np.frombuffer(rec._i["state"], dtype=np.int64)  # a view still held elsewhere
    taken = rec.request_columns(take=True)
    assert read.keys() == taken.keys()
    for name, col in read.items():
        if isinstance(col, np.ndarray):
            np.testing.assert_array_equal(col, taken[name], err_msg=name)
        else:
            assert col == taken[name], name
    assert rec.num_recorded == 300 == len(taken["id"])
    assert (taken["num_preemptions"] > 0).any()  # the pool is tight: preempted requests
    assert held.size == 300  # the view kept its data
    assert not rec._i["id"] and not rec._f["finish"]  # the recorder holds no rows now
    assert len(rec.request_columns()["id"]) == 0


def test_gaps_computed_in_place_block_by_block_equal_the_differences(monkeypatch):
    from orcasim.metrics import recorder

    rec = _ran()
    ends, counts = rec._steps()
    keep = counts > 0
    assert not keep.all()  # steps without ITL tokens (only joiners) are left out in place
    want = np.diff(ends, prepend=0.0)[keep]
    monkeypatch.setattr(recorder, "GAP_BLOCK", 7)  # many blocks, one of a few steps
    gaps, got_counts = rec.itl_samples(take=True)
    np.testing.assert_array_equal(gaps[:want.size], want)
    np.testing.assert_array_equal(got_counts[:want.size], counts[keep])
    assert gaps.size > want.size  # the resumed requests' own gaps follow
    assert rec.num_steps == ends.size and not rec._step_end  # the steps were let go
    with pytest.raises(ValueError, match="ask for itl_times"):
        rec.itl_times()


def test_a_run_without_steps_hands_over_no_gaps():
    from orcasim.metrics.recorder import Recorder

    gaps, counts = Recorder().itl_samples(take=True)
    assert gaps.size == 0 and counts.size == 0


def test_finished_rows_held_as_a_block_equal_rows_recorded_one_by_one():
    """``record_finished`` writes its block column by column through numpy; the values are
    those ``record_request`` writes for each request (floats, whole numbers, the state)."""
    from orcasim.metrics.recorder import Recorder
    from orcasim.request import Request, RequestState

    def finished() -> list[Request]:
        reqs = []
        for i in range(9):
            r = Request(i, 0.1 * i + 1e-9, 7 + i, 3 * i + 1, priority=i % 3 - 1)
            r.first_scheduled, r.first_token, r.finish = 0.3 * i, 0.5 * i + 1, 2.0 ** -i + i
            r.num_output_tokens, r.num_preemptions = r.output_len, i % 2
            r.state = RequestState.FINISHED
            reqs.append(r)
        return reqs

    block, single = Recorder(), Recorder()
    block.record_finished(finished())
    for r in finished():
        single.record_request(r)
    a, b = block.request_columns(), single.request_columns()
    assert a.keys() == b.keys()
    for name, col in a.items():
        if isinstance(col, np.ndarray):
            assert col.dtype == b[name].dtype, name
            np.testing.assert_array_equal(col, b[name], err_msg=name)
        else:
            assert col == b[name], name


def test_one_finisher_without_a_list_as_finish_all_finds():
    """``SchedulerContext.finish_one`` leaves the slots, the request and the recorded rows as
    ``finish_all`` of that one request does: a run's finisher (held in a block), a request
    not running or without a first token, and an end someone acts on (each recorded at
    once)."""
    import simpy

    from orcasim.context import SchedulerContext
    from orcasim.metrics.recorder import Recorder
    from orcasim.request import Request, RequestState

    def case(kind: str, one: bool) -> tuple:
        ctx = SchedulerContext(simpy.Environment(), Recorder())
        ctx.slots.capacity = 4
        ends: list[int] = []
        if kind == "on_end":
            ctx.on_end = lambda r: ends.append(r.id)
        for i in range(3):
            r = Request(i, 0.1 * i, 5 + i, 4)
            r.state = RequestState.RUNNING
            ctx.slots.count += 1
            r.first_scheduled, r.first_token = 0.2 * i, 0.3 * i + 1
            r.num_output_tokens = r.num_computed_tokens = 4
            if kind == "waiting" and i == 1:
                r.state = RequestState.WAITING
                ctx.slots.count -= 1
            if kind == "no-token" and i == 2:
                r.first_token = None
            if one:
                ctx.finish_one(r, 2.0 + i)
            else:
                ctx.finish_all([r], 2.0 + i)
        cols = ctx.recorder.request_columns()
        return (ctx.slots.count, ends, {k: (repr(v.tolist()) if isinstance(v, np.ndarray)
                                            else v) for k, v in cols.items()})

    for kind in ("run", "waiting", "no-token", "on_end"):
        assert case(kind, True) == case(kind, False), kind

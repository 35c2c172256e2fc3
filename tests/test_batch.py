"""DecodeBatch: lazy per-step progress, exact finish steps, slots and KV token totals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orcasim.batch import DecodeBatch
from orcasim.request import Request


def req(i: int, prompt: int, out: int) -> Request:
    return Request(i, 0.0, prompt, out, name=chr(ord("A") + i))


def test_finish_order_slots_and_kv_tokens():
    b = DecodeBatch()
    a, bb, c = req(0, 10, 2), req(1, 5, 3), req(2, 7, 1)
    b.add(a)
    b.add(bb)
    assert (a.slot, bb.slot) == (0, 1)
    assert b.num_kv_tokens == 15
    assert b.advance() == []
    assert b.num_kv_tokens == 17
    assert b.output_tokens(a) == 1 and b.output_tokens(bb) == 1
    assert b.advance() == [a]
    assert a.num_output_tokens == 2 and a.slot == -1
    assert b.num_kv_tokens == 7  # bb: 5 + 2
    b.add(c)
    assert c.slot == 0  # lowest free slot
    assert [x and x.label for x in b.slot_view()] == ["C", "B"]
    assert b.num_kv_tokens == 14
    assert b.advance() == [bb, c]  # joined order
    assert len(b) == 0 and b.num_kv_tokens == 0


def test_remove_writes_back_progress():
    b = DecodeBatch()
    a = req(0, 4, 10)
    b.add(a)
    b.advance()
    b.advance()
    b.remove(a)
    assert a.num_output_tokens == 2
    assert b.num_kv_tokens == 0 and len(b) == 0
    b.advance()
    b.add(a)  # resumes with 8 tokens to go
    assert b.num_kv_tokens == 6
    for _ in range(7):
        assert b.advance() == []
    assert b.advance() == [a]
    with pytest.raises(ValueError):
        b.remove(a)


def test_request_with_nothing_left_is_refused():
    b = DecodeBatch()
    r = req(0, 1, 1)
    r.num_output_tokens = 1
    with pytest.raises(ValueError, match="no tokens left"):
        b.add(r)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30), st.integers(0, 5)),
                min_size=1, max_size=40))
def test_matches_a_token_by_token_model(specs):
    """Random joins over time: finishes and KV totals equal a naive per-token model."""
    b = DecodeBatch()
    naive: dict[int, list[int]] = {}  # id -> [prompt, done, out]
    reqs = [req(i, p, o) for i, (p, o, _) in enumerate(specs)]
    delays = [d for *_, d in specs]
    t = 0
    pending = list(range(len(reqs)))
    while pending or naive:
        while pending and delays[pending[0]] <= t:
            i = pending.pop(0)
            b.add(reqs[i])
            naive[i] = [reqs[i].prompt_len, 0, reqs[i].output_len]
        assert b.num_kv_tokens == sum(p + d for p, d, _ in naive.values())
        if not naive:
            t += 1
            continue
        done = b.advance()
        for v in naive.values():
            v[1] += 1
        expect = [i for i, v in naive.items() if v[1] == v[2]]
        assert [r.id for r in done] == expect
        for i in expect:
            del naive[i]
        for i, v in naive.items():
            assert b.output_tokens(reqs[i]) == v[1]
        t += 1


def test_advance_by_k_is_k_advances_and_never_skips_a_finish():
    one, bulk = DecodeBatch(), DecodeBatch()
    for b in (one, bulk):
        for i, (p, out) in enumerate([(4, 6), (9, 3), (2, 9)]):
            b.add(req(i, p, out))
        b.remove(next(r for r in b if r.id == 1))  # a stale heap entry at step 3
        b.add(req(3, 5, 4))
    for _ in range(3):
        one.advance()
    done = [r.id for r in one.advance()]
    with pytest.raises(ValueError, match="cannot advance 5 steps"):
        bulk.advance(5)  # request 3 finishes at step 4
    assert bulk.num_steps == 0 and bulk.num_kv_tokens == 11  # unchanged by the refusal
    with pytest.raises(ValueError, match="cannot advance 4 steps"):
        bulk.advance(4)  # as first_finish(): the removed member's entry (step 3) counts too
    assert bulk.first_finish() == 3
    assert bulk.advance(3) == []
    assert [r.id for r in bulk.advance()] == done == [3]
    assert (bulk.num_steps, bulk.num_kv_tokens) == (one.num_steps, one.num_kv_tokens)

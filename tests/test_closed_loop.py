"""Closed-loop clients, multi-turn sessions and ShareGPT conversations."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import orcasim
from orcasim.errors import OrcasimError
from orcasim.kv.hashing import BlockHasher, block_content
from orcasim.request import Request
from orcasim.simulation import generate_workload
from orcasim.workload.base import WorkloadArrays
from orcasim.workload.traces import TraceError, load_trace


def load(tmp_path: Path, workload: str, policy: str = "{type: continuous, max_batch: 1}",
         step: float = 0.125) -> orcasim.Scenario:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nworkload:\n{textwrap.indent(textwrap.dedent(workload), '  ')}"
                 f"engine: {{latency: {{type: constant, step_time: {step}}}}}\n"
                 f"policy: {policy}\n")
    return orcasim.load_scenario(p)


CLOSED = """\
type: closed_loop
num_clients: 2
requests_per_client: 3
think_time: 0.5
think_dist: fixed
prompt_len: {type: fixed, value: 4}
output_len: {type: fixed, value: 3}
"""


def test_closed_loop_clients_wait_for_their_answer(tmp_path):
    res = orcasim.simulate(load(tmp_path, CLOSED))
    df = res.requests
    assert df["name"].tolist() == ["c0.r0", "c1.r0", "c0.r1", "c1.r1", "c0.r2", "c1.r2"]
    # one slot, 3 steps of 0.125 s per request; a client's next request 0.5 s after its answer
    assert df["arrival"].tolist() == [0.0, 0.0, 0.875, 1.25, 1.75, 2.125]
    assert df["first_scheduled"].tolist() == [0.0, 0.375, 0.875, 1.25, 1.75, 2.125]
    assert df["finish"].tolist() == [0.375, 0.75, 1.25, 1.625, 2.125, 2.5]
    assert (df["finish"].iloc[:4].to_numpy() + 0.5).tolist() == df["arrival"].iloc[2:].tolist()


def test_closed_loop_offered_load_follows_the_service(tmp_path):
    fast = orcasim.simulate(load(tmp_path, CLOSED, step=0.125)).requests
    slow = orcasim.simulate(load(tmp_path, CLOSED, step=0.25)).requests
    assert slow["arrival"].iloc[-1] > fast["arrival"].iloc[-1]
    assert slow["arrival"].tolist() == [0.0, 0.0, 1.25, 2.0, 2.75, 3.5]


def test_closed_loop_ramp_up_and_think_draws(tmp_path):
    wl = CLOSED.replace("think_dist: fixed", "think_dist: exponential") + "ramp_up: 1.0\n"
    arrays = generate_workload(load(tmp_path, wl).variants[0])
    assert arrays.arrival[:2].tolist() == [0.0, 0.5]
    assert np.isnan(arrays.arrival[2:]).all()
    assert arrays.after.tolist() == [-1, -1, 0, 1, 2, 3]
    rng = np.random.default_rng(0)
    expected = rng.exponential(0.5, size=6)
    assert arrays.think[2:].tolist() == expected[2:].tolist()


SESSIONS = """\
type: sessions
num_sessions: 2
arrival: {type: at_once, time: 0.0}
turns: {type: fixed, value: 3}
input_len: {type: fixed, value: 20}
output_len: {type: fixed, value: 2}
think_time: 1.0
think_dist: fixed
system_prompt_len: 32
hash_block_size: 16
"""


def test_session_turns_follow_answers_and_grow(tmp_path):
    sc = load(tmp_path, SESSIONS, policy="{type: continuous, max_batch: 4}")
    arrays = generate_workload(sc.variants[0])
    assert arrays.prompt_len.tolist() == [52, 74, 96, 52, 74, 96]
    assert arrays.after.tolist() == [-1, 0, 1, -1, 3, 4]
    assert arrays.attrs["session"] == ["s0", "s0", "s0", "s1", "s1", "s1"]
    ids = arrays.attrs["hash_ids"]
    assert ids[:3] == [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]
    assert ids[3:] == [[0, 1, 6, 7], [0, 1, 6, 7, 8], [0, 1, 6, 7, 8, 9]]
    df = orcasim.simulate(sc).requests
    # both sessions start at 0 and run together: 2 steps per turn, then 1 s of thinking
    assert df["arrival"].tolist() == [0.0, 1.25, 2.5, 0.0, 1.25, 2.5]
    assert df["finish"].tolist() == [0.25, 1.5, 2.75, 0.25, 1.5, 2.75]


def requests_of(arrays: WorkloadArrays) -> list[Request]:
    out = []
    for i in range(len(arrays)):
        r = Request(i, 0.0, int(arrays.prompt_len[i]), int(arrays.output_len[i]))
        for key, col in arrays.attrs.items():
            setattr(r, key, col[i])
        out.append(r)
    return out


def test_session_prefix_blocks_are_shared_exactly(tmp_path):
    arrays = generate_workload(load(tmp_path, SESSIONS).variants[0])
    reqs = requests_of(arrays)
    hasher = BlockHasher()

    def chain(r: Request, bs: int) -> list[int]:
        full = r.prompt_len // bs  # full prompt blocks
        return hasher.chain(block_content(r, bs, b) for b in range(full))

    for bs in (16, 8, 32):
        s0t0, s0t1, s0t2, s1t1 = (chain(reqs[i], bs) for i in (0, 1, 2, 4))
        # a turn's full prompt blocks are a prefix of the next turn's
        assert len(s0t0) < len(s0t1) < len(s0t2)
        assert s0t1[: len(s0t0)] == s0t0 and s0t2[: len(s0t1)] == s0t1
        # sessions share only the system prompt's whole blocks
        shared = 32 // bs
        assert s1t1[:shared] == s0t1[:shared]
        assert s1t1[shared] != s0t1[shared]


SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hello there, how are you?"},
        {"from": "gpt", "value": "Fine, thanks."},
        {"from": "human", "value": "Tell me a joke."},
        {"from": "gpt", "value": ""},
    ]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "Hi"}]},
    {"id": "c", "messages": [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "Thanks"},
    ]},
]


@pytest.fixture
def sharegpt(tmp_path) -> Path:
    """SHAREGPT written as a ShareGPT JSON file."""
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    return path


def test_sharegpt_turns_with_the_character_estimate(sharegpt):
    tr = load_trace(sharegpt)
    # ceil(chars / 4): "Be brief." 3, "Hello there, how are you?" 7, "Fine, thanks." 4,
    # "Tell me a joke." 4, "" 0 -> 1, "What is two plus two?" 6, "Four." 2
    assert tr.session.tolist() == [0, 0, 2]
    assert tr.turn.tolist() == [0, 1, 0]
    assert tr.new_prompt_len.tolist() == [3 + 7, 4, 6]
    assert tr.prompt_len.tolist() == [10, 10 + 4 + 4, 6]
    assert tr.output_len.tolist() == [4, 1, 2]
    assert tr.num_skipped == 1


def test_sharegpt_tokens_counted_with_a_tokenizer_file(tmp_path, sharegpt):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    texts = [m["value"] if "value" in m else m["content"] for conv in SHAREGPT
             for m in conv.get("conversations", conv.get("messages"))]
    words = sorted({w for t in texts for w in t.replace(",", " ").replace("?", " ")
                    .replace(".", " ").split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", ",", "?", ".", *words])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    tr = load_trace(sharegpt, tokenizer=str(tok_path))
    # words and punctuation: "Be brief ." 3, "Hello there , how are you ?" 7, "Fine , thanks ." 4,
    # "Tell me a joke ." 5, "" 0 -> 1, "What is two plus two ?" 6, "Four ." 2
    assert tr.prompt_len.tolist() == [10, 19, 6]
    assert tr.output_len.tolist() == [4, 1, 2]


@pytest.mark.parametrize("data,message", [
    ({"not": "a list"}, "expected a JSON list of conversations"),
    ([{"id": "x"}], "conversation 0 (id 'x'): missing key 'conversations'"),
    ([{"conversations": [{"from": "human"}]}], "conversation 0, message 0: 'value'"),
    ([{"conversations": [{"from": "human", "value": "hi"}]}], "no conversation has a user"),
])
def test_sharegpt_malformed(tmp_path, data, message):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert str(exc.value).startswith(f"{path}")
    assert message in str(exc.value)


def test_sessions_from_a_sharegpt_file(tmp_path, sharegpt):
    sc = load(tmp_path, f"""\
        type: sessions
        file: {sharegpt}
        arrival: {{type: poisson, rate: 1.0}}
        think_time: 2.0
        """, policy="{type: continuous, max_batch: 4}")
    arrays = generate_workload(sc.variants[0])
    assert arrays.prompt_len.tolist() == [10, 18, 6]
    assert arrays.output_len.tolist() == [4, 1, 2]
    assert arrays.attrs["session"] == ["s0", "s0", "s1"]
    assert arrays.after.tolist() == [-1, 0, -1]
    res = orcasim.simulate(sc)
    assert res.summary["continuous"]["num_finished"] == 3
    with pytest.raises(OrcasimError, match="2 conversations with turns, fewer than "
                       r"num_sessions \(5\)"):
        generate_workload(load(tmp_path, f"""\
            type: sessions
            file: {sharegpt}
            num_sessions: 5
            arrival: {{type: poisson, rate: 1.0}}
            """).variants[0])


def test_chained_arrays_are_checked():
    base = dict(arrival=np.array([0.0, np.nan]), prompt_len=np.array([1, 1]),
                output_len=np.array([1, 1]))
    WorkloadArrays(**base, after=np.array([-1, 0]), think=np.array([0.0, 1.0])).check()
    with pytest.raises(OrcasimError, match="request 1: it must come after an earlier"):
        WorkloadArrays(**base, after=np.array([-1, 1]), think=np.array([0.0, 1.0])).check()
    with pytest.raises(OrcasimError, match=r"request 1: think time -1\.0 is not a finite"):
        WorkloadArrays(**base, after=np.array([-1, 0]), think=np.array([0.0, -1.0])).check()
    with pytest.raises(OrcasimError, match="request 0: arrival time nan"):
        WorkloadArrays(**{**base, "arrival": np.array([np.nan, np.nan])}).check()


def test_trace_workload_takes_first_turns_of_sharegpt(tmp_path, sharegpt):
    sc = load(tmp_path, f"""\
        type: trace
        file: {sharegpt}
        arrival: {{type: poisson, rate: 1.0}}
        """)
    arrays = generate_workload(sc.variants[0])
    # conversations a and c (b has no answered turn), their first turns only
    assert arrays.prompt_len.tolist() == [10, 6]
    assert arrays.output_len.tolist() == [4, 2]
    assert arrays.arrival.tolist() == np.cumsum(
        np.random.default_rng(0).exponential(1.0, size=2)).tolist()

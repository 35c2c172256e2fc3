"""Trace loaders and the ``trace`` workload: real files, shipped slices, malformed rows."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import orcasim
from orcasim.cli import main
from orcasim.errors import OrcasimError
from orcasim.kv.hashing import block_content
from orcasim.request import Request
from orcasim.simulation import generate_workload
from orcasim.workload.traces import TraceError, load_trace

FULL = Path("/work/shared/data/traces")

AZURE_HEAD = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_shipped_slices_load_with_their_sizes():
    sizes = {"azure_conv": 2867, "azure_code": 1482, "mooncake_conversation": 918,
             "sharegpt_lengths": 1000, "arxiv_lengths": 1000, "bwb_lengths": 1000}
    for name, n in sizes.items():
        tr = load_trace(name)
        assert len(tr) == n, name
        assert tr.output_len.min() >= 1 and tr.prompt_len.min() >= 0
    conv = load_trace("azure_conv")
    assert conv.arrival[:3].tolist() == pytest.approx([0.0, 4.314579, 4.541877])
    assert conv.prompt_len[:3].tolist() == [374, 396, 879]
    assert conv.output_len[:3].tolist() == [44, 109, 55]
    assert conv.arrival[-1] < 600.0
    moon = load_trace("mooncake_conversation")
    assert moon.hash_block_size == 512
    assert moon.prompt_len[0] == 6758 and moon.output_len[0] == 500
    assert moon.hash_ids[0] == tuple(range(14))
    assert moon.hash_ids[1][:2] == (0, 14)
    assert load_trace("bwb_lengths").arrival is None


@pytest.mark.skipif(not FULL.is_dir(), reason="full traces not present")
def test_full_files_match_their_published_statistics():
    conv = load_trace(FULL / "AzureLLMInferenceTrace_conv.csv")
    assert len(conv) == 19366
    assert conv.prompt_len.mean() == pytest.approx(1155, abs=1)
    assert conv.output_len.mean() == pytest.approx(211, abs=1)
    assert conv.arrival[-1] == pytest.approx(3501.72, abs=0.01)
    moon = load_trace(FULL / "conversation_trace.jsonl")
    assert len(moon) == 12031 and int(moon.prompt_len.max()) == 126195
    blocks = [h for ids in moon.hash_ids for h in ids]
    assert len(blocks) == 288500 and len(set(blocks)) == 182790


@pytest.mark.parametrize("text,line,message", [
    (AZURE_HEAD.replace("ContextTokens", "Context"), 1, "missing column 'ContextTokens'"),
    (AZURE_HEAD.replace(",396,", ",-396,"), 3, "ContextTokens: -396 is negative"),
    (AZURE_HEAD.replace(",396,", ",39x,"), 3, "ContextTokens: '39x' is not a whole number"),
    (AZURE_HEAD.replace(",109", ",0"), 3, "GeneratedTokens: 0 is below 1"),
    (AZURE_HEAD.replace(",879,55", ",879"), 4, "expected 3 fields, found 2"),
    (AZURE_HEAD.replace("18:15:50.99", "18:15:40.99"), 3, "TIMESTAMP goes back in time"),
    (AZURE_HEAD.replace("18:15:51.22", "18:15:5x.22"), 4, "is not a date and time"),
])
def test_malformed_azure_rows_name_file_and_line(tmp_path, text, line, message):
    path = write(tmp_path, "az.csv", text)
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert str(exc.value).startswith(f"{path}:{line}: ")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def mooncake_rows(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


@pytest.mark.parametrize("second,message", [
    ({**GOOD, "timestamp": -3}, "timestamp: -3 is not a finite number >= 0"),
    ({**GOOD, "input_length": "600"}, "input_length: '600' is not a whole number"),
    ({**GOOD, "hash_ids": [0]}, "1 hash_ids for input_length 600: expected ceil(600 / 512) = 2"),
    ({**GOOD, "hash_ids": [0, -1]}, "hash_ids must be a list of whole numbers >= 0"),
    ({k: v for k, v in GOOD.items() if k != "output_length"}, "missing key 'output_length'"),
    ({**GOOD, "output_length": 2.5}, "output_length: 2.5 is not a whole number"),
])
def test_malformed_mooncake_rows(tmp_path, second, message):
    path = write(tmp_path, "m.jsonl", mooncake_rows({**GOOD, "timestamp": 0}, second))
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert str(exc.value).startswith(f"{path}:2: {message}")


def test_mooncake_unsorted_and_bad_json(tmp_path):
    path = write(tmp_path, "m.jsonl", mooncake_rows({**GOOD, "timestamp": 3000}, GOOD))
    with pytest.raises(TraceError, match=r"m\.jsonl:2: timestamp goes back in time"):
        load_trace(path)
    path = write(tmp_path, "b.jsonl", mooncake_rows(GOOD) + "{not json\n")
    with pytest.raises(TraceError, match=r"b\.jsonl:2: not a JSON object"):
        load_trace(path)


def test_length_table_checks_its_total(tmp_path):
    path = write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,"
                 "pd_ratio\n10,5,15,2.0\n7,3,11,2.3\n")
    with pytest.raises(TraceError, match=r"l\.csv:3: num_total_tokens 11 is not .* \(10\)"):
        load_trace(path)


def test_unknown_file_and_format(tmp_path):
    with pytest.raises(TraceError, match=r"no such trace file .*shipped slices: azure_conv"):
        load_trace(tmp_path / "nope.csv")
    path = write(tmp_path, "x.csv", "a,b\n1,2\n")
    with pytest.raises(TraceError, match=r"x\.csv:1: cannot tell the trace format"):
        load_trace(path)


def scenario(tmp_path: Path, workload: str, policy: str = "{type: continuous, max_batch: 8}"):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: t
        workload: {workload}
        engine: {{latency: {{type: constant, step_time: 0.01}}}}
        policy: {policy}
        """))
    return p


def test_trace_workload_replays_a_window(tmp_path):
    sc = orcasim.load_scenario(scenario(
        tmp_path, "{type: trace, file: azure_conv, start: 4.0, end: 10.0, speedup: 2.0}"))
    arrays = generate_workload(sc.variants[0])
    full = load_trace("azure_conv")
    rows = np.flatnonzero((full.arrival >= 4.0) & (full.arrival < 10.0))
    assert arrays.arrival.tolist() == pytest.approx(((full.arrival[rows] - 4.0) / 2).tolist())
    assert arrays.prompt_len.tolist() == full.prompt_len[rows].tolist()
    assert arrays.output_len.tolist() == full.output_len[rows].tolist()


def test_length_table_with_an_arrival_process(tmp_path):
    sc = orcasim.load_scenario(scenario(
        tmp_path, "{type: trace, file: bwb_lengths, max_requests: 50, shuffle: true, "
        "arrival: {type: gamma, rate: 2.0, cv: 2.0}}"))
    arrays = generate_workload(sc.variants[0])
    table = load_trace("bwb_lengths")
    rng = np.random.default_rng(0)
    rows = rng.permutation(1000)[:50]
    assert arrays.prompt_len.tolist() == table.prompt_len[rows].tolist()
    assert arrays.output_len.tolist() == table.output_len[rows].tolist()
    gaps = rng.gamma(0.25, 1.0 / (0.25 * 2.0), size=50)
    assert arrays.arrival.tolist() == np.cumsum(gaps).tolist()


def test_length_table_without_arrivals_is_an_error(tmp_path):
    sc = orcasim.load_scenario(scenario(tmp_path, "{type: trace, file: sharegpt_lengths}"))
    with pytest.raises(OrcasimError, match="sharegpt_lengths: this trace has no arrival times"):
        generate_workload(sc.variants[0])
    with pytest.raises(orcasim.ScenarioError, match="apply to the trace's own times"):
        orcasim.load_scenario(scenario(tmp_path, "{type: trace, file: sharegpt_lengths, "
                                       "speedup: 2, arrival: {type: poisson, rate: 1}}"))


def test_mooncake_requests_carry_their_blocks(tmp_path):
    sc = orcasim.load_scenario(scenario(tmp_path, "{type: trace, file: mooncake_conversation, "
                                        "max_requests: 4}"))
    arrays = generate_workload(sc.variants[0])
    reqs = []
    for i in range(2):
        r = Request(i, 0.0, int(arrays.prompt_len[i]), 1)
        r.hash_ids = arrays.attrs["hash_ids"][i]
        r.hash_block_size = arrays.attrs["hash_block_size"][i]
        reqs.append(r)
    # both prompts start with hash block 0: their first 512 tokens (32 KV blocks of 16) match
    for b in range(32):
        assert block_content(reqs[0], 16, b) == block_content(reqs[1], 16, b)
    assert block_content(reqs[0], 16, 32) != block_content(reqs[1], 16, 32)


def test_malformed_trace_in_a_run_is_one_line(tmp_path, capsys):
    bad = write(tmp_path, "az.csv", AZURE_HEAD.replace(",396,", ",-396,"))
    p = scenario(tmp_path, f"{{type: trace, file: {bad}}}")
    assert main(["run", str(p), "--no-plots", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"orcasim: error: {bad}:3: ContextTokens: -396 is negative\n"


def test_request_classes_on_a_trace(tmp_path):
    sc = orcasim.load_scenario(scenario(tmp_path, """
          type: trace
          file: azure_code
          max_requests: 400
          classes:
            - {name: interactive, weight: 3, priority: 0, deadline: 2.0, tenant: a}
            - {name: batch, weight: 1, priority: 1, prefix_id: sys, prefix_len: 100}"""))
    arrays = generate_workload(sc.variants[0])
    base = load_trace("azure_code").prompt_len[:400]
    cls = np.array(arrays.attrs["cls"])
    expected = np.random.default_rng(0).choice(2, size=400, p=[0.75, 0.25])
    assert (cls == "batch").tolist() == (expected == 1).tolist()
    batch = cls == "batch"
    assert arrays.prompt_len.tolist() == (base + 100 * batch).tolist()
    assert arrays.attrs["deadline"] == [None if b else 2.0 for b in batch]
    assert arrays.attrs["priority"] == [1 if b else 0 for b in batch]
    res = orcasim.simulate(sc)
    df = res.requests
    assert df["cls"].tolist() == cls.tolist()
    tenant = [t if isinstance(t, str) else None for t in df["tenant"]]
    assert tenant == [None if b else "a" for b in batch]


def test_azure_conv_scenario_reports_latency_percentiles():
    res = orcasim.simulate("azure_conv")
    trace = load_trace("azure_conv")
    assert list(res) == ["half-rate", "trace-rate"]
    for name in res:
        s = res.summary[name]
        assert s["num_requests"] == s["num_finished"] == 2867
        for metric in ("ttft", "tpot", "e2e"):
            p50, p90, p99 = (s[f"{metric}_p{q}"] for q in (50, 90, 99))
            assert 0 < p50 <= p90 <= p99
    half = res["half-rate"].requests
    assert half["arrival"].tolist() == pytest.approx((trace.arrival * 2).tolist())
    assert half["prompt_len"].tolist() == trace.prompt_len.tolist()
    # the roofline model's cheapest step: Llama-2-7B weights over 80 % of the A100's bandwidth
    assert half["ttft"].min() > 13.48e9 / (2039e9 * 0.8)
    # twice the load on one GPU: the queue builds up
    assert res.summary["trace-rate"]["ttft_p50"] > 20 * res.summary["half-rate"]["ttft_p50"]

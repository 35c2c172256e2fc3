"""Replaying a measured vLLM run: block hashing, token-id traces, the command, the front end."""

from __future__ import annotations

import csv
import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ROOT
from test_profile_latency import write_profile

import orcasim
from orcasim.cli import main
from orcasim.frontend import FrontendOptions
from orcasim.kv.hashing import vllm_block_hashes
from orcasim.replay.queued import simulated_queued
from orcasim.workload.traces import TraceError, load_trace

REAL = ROOT.parent / "shared" / "realdata"
needs_real = pytest.mark.skipif(not (REAL / "vllm_runs").is_dir(),
                                reason="shared/realdata not present")

# -- vLLM's block hashes ----------------------------------------------------------------------

#: vLLM's hashes of the two full blocks of tokens 1000..1039 (block size 16, the default
#: ``sha256`` algorithm, PYTHONHASHSEED=0): hash_block_tokens(sha256, parent, block, None)
KNOWN_PROMPT = list(range(1000, 1040))
KNOWN_HASHES = ["754160d569fbeb0e17f9979e900903dcf2d2313dc721c02de978b60cbf798ad6",
                "97cf935fa8f84a6e1185b6a906e9b4560d2b8223dd3f84ea88ba69d48980004b"]


def test_block_hashes_follow_vllm_on_a_known_prompt():
    hashes = vllm_block_hashes(KNOWN_PROMPT, 16)
    assert [h.hex() for h in hashes] == KNOWN_HASHES  # the 8-token tail is not hashed
    # the chain, spelled out: SHA-256 of the pickled (parent, block tokens, extra keys)
    none_hash = hashlib.sha256(pickle.dumps("0", protocol=5)).digest()
    first = hashlib.sha256(pickle.dumps((none_hash, tuple(range(1000, 1016)), None),
                                        protocol=5)).digest()
    assert hashes[0] == first
    # a block's hash depends on everything before it
    changed = vllm_block_hashes([7, *KNOWN_PROMPT[1:]], 16)
    assert changed[0] != hashes[0] and changed[1] != hashes[1]
    assert vllm_block_hashes(KNOWN_PROMPT, 16, seed="1")[0] != hashes[0]
    assert vllm_block_hashes(KNOWN_PROMPT[:15], 16) == []


def token_rows() -> list[dict]:
    a = list(range(1000, 1040))
    return [
        {"input_toks": 40, "output_toks": 3, "arrival_time_ns": 0, "input_tok_ids": a},
        {"input_toks": 40, "output_toks": 4, "arrival_time_ns": 1_000_000,
         "input_tok_ids": a[:32] + list(range(5000, 5008))},
        {"input_toks": 33, "output_toks": 2, "arrival_time_ns": 2_000_000,
         "input_tok_ids": [1, *a[1:33]]},
        {"input_toks": 20, "output_toks": 5, "arrival_time_ns": 30_000_000,
         "input_tok_ids": list(range(20)), "output_tok_ids": [1, 2, 3, 4, 5]},
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_token_trace_shares_exactly_the_blocks_vllm_would(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", token_rows())
    trace = load_trace(path, hash_block_size=16)  # detected from the first line
    assert trace.hash_block_size == 16
    assert trace.prompt_len.tolist() == [40, 40, 33, 20]
    assert trace.output_len.tolist() == [3, 4, 2, 5]
    assert trace.arrival.tolist() == [0.0, 0.001, 0.002, 0.03]
    # full blocks only; the second request shares both blocks of the first; the third
    # differs in its first token, so it shares nothing although tokens 1..32 agree
    assert trace.hash_ids == ((0, 1), (0, 1), (2, 3), (4,))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.update(input_toks=41), "w.jsonl:2: input_toks is 41 but input_tok_ids has 40"),
    (lambda r: r.pop("arrival_time_ns"), "w.jsonl:2: missing key 'arrival_time_ns'"),
    (lambda r: r.update(input_tok_ids=[1, -2]), "w.jsonl:2: input_tok_ids must be a list"),
    (lambda r: r.update(arrival_time_ns=-5), "w.jsonl:2: arrival_time_ns: -5 is not a finite"),
])
def test_token_trace_errors_name_the_line(tmp_path, edit, message):
    rows = token_rows()
    edit(rows[1])
    with pytest.raises(TraceError) as err:
        load_trace(write_jsonl(tmp_path / "w.jsonl", rows), "tokens", hash_block_size=16)
    assert message in str(err.value) and "\n" not in str(err.value)


# -- the replay command -----------------------------------------------------------------------

MEASURED = [  # queued, first token, last token (s, engine clock)
    (100.000, 100.050, 100.120), (100.001, 100.070, 100.200),
    (100.002, 100.080, 100.110), (100.030, 100.060, 100.180)]


def make_run(root: Path, meta_extra: dict | None = None) -> tuple[Path, Path, Path]:
    """A run directory, its workload and a profile: (run, workload, profile)."""
    run = root / "run"
    run.mkdir(parents=True)
    rows = token_rows()
    meta = {"model": "toy/Toy-1B", "vllm_version": "0.19.0", "num_requests": 4,
            "num_gpu_blocks": 64,
            "engine_kwargs": {"model": "toy/Toy-1B", "tensor_parallel_size": 1,
                              "max_num_seqs": 2, "max_num_batched_tokens": 64,
                              "max_model_len": 256}}
    meta.update(meta_extra or {})
    (run / "meta.json").write_text(json.dumps(meta))
    write_jsonl(run / "requests.jsonl", [
        {"request_id": f"r{i}", "input_toks": r["input_toks"], "output_toks": r["output_toks"],
         "queued_ts": q, "first_token_ts": f, "last_token_ts": e}
        for i, (r, (q, f, e)) in enumerate(zip(rows, MEASURED, strict=True))])
    (run / "timeseries.csv").write_text("t,running,waiting\n1.0,2,1\n2.0,0,0\n")
    return run, write_jsonl(root / "w.jsonl", rows), write_profile(root / "profile")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_replay_writes_the_comparison_and_a_scenario_that_reruns(tmp_path, capsys):
    run, workload, profile = make_run(tmp_path)
    out = tmp_path / "out"
    assert main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                 str(profile), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "TTFT mean (ms)" in printed and "E2E p99 (ms)" in printed
    for name in ("scenario.yaml", "comparison.csv", "requests.csv", "latency_cdf.png",
                 "running_waiting.png"):
        assert (out / name).is_file(), name
    rows = {r["metric"]: r for r in read_csv(out / "comparison.csv")}
    assert list(rows) == [f"{m}_{s}_ms" for m in ("ttft", "tpot", "e2e")
                          for s in ("mean", "median", "p90", "p95", "p99")]
    q, f, e = (np.array(c) for c in zip(*MEASURED, strict=True))
    n_out = np.array([3, 4, 2, 5])
    assert float(rows["ttft_mean_ms"]["measured"]) == pytest.approx(((f - q) * 1e3).mean(),
                                                                     rel=1e-5)
    assert float(rows["tpot_median_ms"]["measured"]) == pytest.approx(
        np.median((e - f) / (n_out - 1) * 1e3), rel=1e-5)
    assert float(rows["e2e_p90_ms"]["measured"]) == pytest.approx(
        np.percentile((e - q) * 1e3, 90), rel=1e-5)
    for r in rows.values():
        a, b = float(r["measured"]), float(r["predicted"])
        assert float(r["error_pct"]) == pytest.approx(100 * (b - a) / a, rel=1e-4)
    # the scenario: the run's engine arguments, the token trace, the profile
    sc = yaml.safe_load((out / "scenario.yaml").read_text())
    assert sc["policy"] == {"type": "vllm-v1", "max_num_seqs": 2, "max_num_batched_tokens": 64,
                            "max_model_len": 256, "block_size": 16,
                            "enable_prefix_caching": True, "enable_chunked_prefill": True,
                            "async_scheduling": True, "num_blocks": 64}
    assert sc["workload"]["format"] == "tokens" and sc["workload"]["hash_block_size"] == 16
    assert sc["engine"]["latency"]["type"] == "profile"
    # running it by hand gives the same predictions (TTFT counted, as vLLM's, from when the
    # engine took the request: tests/test_replay_queued.py)
    res = orcasim.simulate(orcasim.load_scenario(out / "scenario.yaml"))
    by_hand = next(iter(res.variants.values()))
    queued = simulated_queued(by_hand.columns, by_hand.series, lockstep=False)
    per_request = read_csv(out / "requests.csv")
    assert [r["request_id"] for r in per_request] == ["r0", "r1", "r2", "r3"]
    assert [float(r["predicted_ttft_ms"]) for r in per_request] == pytest.approx(
        ((by_hand.columns["first_token"] - queued) * 1e3).tolist(), rel=1e-5)
    assert [float(r["measured_e2e_ms"]) for r in per_request] == pytest.approx(
        ((e - q) * 1e3).tolist(), rel=1e-5)
    # the second request found the first one's two blocks in the prefix cache
    assert next(iter(res.variants.values())).summary["prefix_cache_hit_rate"] > 0


def bad_runs():
    def more_requests(run, workload, profile):
        rows = token_rows()
        write_jsonl(workload, [*rows, rows[0] | {"arrival_time_ns": 40_000_000}])

    def other_lengths(run, workload, profile):
        rows = token_rows()
        rows[2]["output_toks"] = 9
        write_jsonl(workload, rows)

    def missing_key(run, workload, profile):
        lines = (run / "requests.jsonl").read_text().splitlines()
        row = json.loads(lines[1])
        del row["first_token_ts"]
        lines[1] = json.dumps(row)
        (run / "requests.jsonl").write_text("\n".join(lines) + "\n")

    def missing_profile_column(run, workload, profile):
        path = profile / "tp1" / "attention.csv"
        path.write_text(path.read_text().replace("kv_decode", "kvd", 1))

    def no_blocks(run, workload, profile):
        meta = json.loads((run / "meta.json").read_text())
        del meta["num_gpu_blocks"]
        (run / "meta.json").write_text(json.dumps(meta))

    return [
        (more_requests, "w.jsonl: 5 requests, but the run"),
        (other_lengths, "request 3 has output_toks 9, but the run's request r2 has 2"),
        (missing_key, "requests.jsonl:2: missing key 'first_token_ts'"),
        (missing_profile_column, "kv_decode"),
        (no_blocks, "records no num_gpu_blocks"),
    ]


@pytest.mark.parametrize(("spoil", "message"), bad_runs())
def test_replay_input_mistakes_are_one_line_with_status_2(tmp_path, capsys, spoil, message):
    run, workload, profile = make_run(tmp_path)
    spoil(run, workload, profile)
    code = main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                 str(profile), "--out", str(tmp_path / "out"), "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "\n" not in err and "Traceback" not in err


@needs_real
def test_shipped_rtx_pro_6000_run_with_its_profiles(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["replay-vllm", str(REAL / "vllm_runs" / "RTXPRO6000_Llama-3.1-8B"),
                 "--workload", str(REAL / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
                 "--profiles", str(REAL / "profiles" / "RTXPRO6000" / "meta-llama" /
                                   "Llama-3.1-8B" / "bf16"),
                 "--gpu-memory-gb", "96", "--out", str(out), "--no-plots"]) == 0
    print(capsys.readouterr().out)
    err = {r["metric"]: float(r["error_pct"]) for r in read_csv(out / "comparison.csv")}
    # the prediction uses only the engine arguments, the workload and the operator profiles
    assert abs(err["tpot_mean_ms"]) < 3 and abs(err["e2e_mean_ms"]) < 5
    assert abs(err["ttft_mean_ms"]) < 10


# -- the front end ----------------------------------------------------------------------------

def test_frontend_queues_requests_in_one_server_and_delays_each_message():
    fe = FrontendOptions(request_s=0.001, per_prompt_token_s=1e-5, per_output_s=0.002,
                         messages_per_token=2)
    # both sent at 0: the second waits for the first one's 1 ms + 10 ms of tokenising
    assert fe.service(1000) == pytest.approx(0.011) and fe.service(10) == pytest.approx(0.0011)
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [
            {"arrival": 0, "prompt_len": 1000, "output_len": 3},
            {"arrival": 0, "prompt_len": 10, "output_len": 2}]},
        "engine": {"latency": {"type": "constant", "step_time": 0.01},
                   "frontend": fe.model_dump()},
        "policy": {"type": "vllm-v1"}})
    v = next(iter(orcasim.simulate(sc).variants.values()))
    req = v.requests
    assert req.arrival.tolist() == pytest.approx([0.011, 0.0121])  # the engine's queue
    assert req.sent.tolist() == [0.0, 0.0]  # the clients' sends
    assert req.first_token.tolist() == pytest.approx([0.021, 0.031])
    assert req.finish.tolist() == pytest.approx([0.041, 0.041])
    s = v.summary
    assert s["client_ttft_mean"] == pytest.approx((0.023 + 0.033) / 2)
    assert s["client_e2e_p50"] == pytest.approx(0.043)
    assert s["client_tpot_mean"] == pytest.approx(0.01)
    # 6 and 4 messages: 0.020 s over 5 gaps, 0.010 s over 3
    assert s["client_tpot_per_message_mean"] == pytest.approx((0.004 + 0.01 / 3) / 2)
    # off: the engine sees the client's arrival times
    sc_off = orcasim.Scenario({**sc.raw, "engine": {"latency": sc.raw["engine"]["latency"]}})
    off = next(iter(orcasim.simulate(sc_off).variants.values()))
    assert off.requests.arrival.tolist() == [0.0, 0.0] and "client_ttft_mean" not in off.summary


def test_the_real_gpu_page_examples_run():
    import re

    text = (ROOT / "docs" / "real-gpu.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    assert len(blocks) == 2
    for block in blocks:
        sc = orcasim.Scenario({
            "workload": {"type": "list", "requests": [
                {"arrival": 0.01 * i, "prompt_len": 200 + 50 * i, "output_len": 4}
                for i in range(4)]},
            "policy": {"type": "vllm-v1", "max_num_seqs": 4}, **block})
        summary = next(iter(orcasim.simulate(sc).variants.values())).summary
        assert summary["num_finished"] == 4
        assert ("client_ttft_mean" in summary) == ("frontend" in block["engine"])


def test_replay_reads_what_vllm_resolved_over_the_arguments_given(tmp_path):
    from orcasim.replay.scenario import build_scenario

    meta = {"model": "toy/Toy-1B", "vllm_version": "0.11.0",
            "engine_kwargs": {"max_num_seqs": 8, "max_num_batched_tokens": None,
                              "max_model_len": None},
            "kv_cache": {"num_gpu_blocks": 500, "block_size": 32},
            "resolved_config": {
                "scheduler_config": {"max_num_batched_tokens": 4096, "max_model_len": 2048,
                                     "async_scheduling": True,
                                     "long_prefill_token_threshold": 512},
                "cache_config": {"enable_prefix_caching": False, "num_gpu_blocks": None}}}
    sc = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=tmp_path)
    assert sc["policy"] == {"type": "vllm-v1", "max_num_seqs": 8,
                            "max_num_batched_tokens": 4096, "max_model_len": 2048,
                            "block_size": 32, "enable_prefix_caching": False,
                            "enable_chunked_prefill": True, "async_scheduling": True,
                            "long_prefill_token_threshold": 512, "num_blocks": 500}
    assert sc["workload"]["hash_block_size"] == 32
    # vLLM 0.11 did not schedule asynchronously by default: the step gap without it
    del meta["resolved_config"]["scheduler_config"]["async_scheduling"]
    sc = build_scenario(meta, "meta.json", tmp_path / "w.jsonl", profiles=tmp_path)
    assert sc["policy"]["async_scheduling"] is False
    assert sc["engine"]["latency"]["overhead_s"] == 5.5e-3


# -- the KV cache size --------------------------------------------------------------------------

LLAMA_4090 = {"model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0",
              "engine_kwargs": {"max_num_seqs": 256, "max_num_batched_tokens": 2048,
                                "max_model_len": 32768},
              "hardware": {"device_name": "NVIDIA GeForce RTX 4090",
                           "device_total_memory_bytes": 25_250_627_584}}


def kv_sizing(meta: dict, profiles: Path | None = None, **kw) -> tuple[dict, int]:
    from orcasim.kv.config import MemoryOptions, resolve
    from orcasim.replay.scenario import build_scenario

    sc = build_scenario(meta, "meta.json", Path("w.jsonl"), profiles=profiles,
                        gpu=None if profiles else "rtx-4090", **kw)
    return sc["memory"], resolve(MemoryOptions(**sc["memory"])).num_blocks


def test_kv_cache_is_sized_from_the_memory_cuda_reported_less_vllms_reserve():
    from orcasim.replay.scenario import KV_RESERVE_GIB

    mem, blocks = kv_sizing(LLAMA_4090)
    assert mem["gpu_memory_gb"] == 25.250627584
    assert mem["activation_reserve_gb"] == pytest.approx(1.42 * 2**30 / 1e9) == \
        KV_RESERVE_GIB * 2**30 / 1e9
    # 25,250,627,584 x 0.9 - 16.06e9 of weights - 1.5247e9 = 5.1409e9 bytes; 2 MiB a block
    assert blocks == int((25_250_627_584 * 0.9 - 16.06e9 - 1.42 * 2**30) // (16 * 131_072))
    assert blocks == 2451
    # the reserve given: none at all leaves 3,178 blocks
    assert kv_sizing(LLAMA_4090, kv_reserve_gb=0)[1] == 3178
    # --num-gpu-blocks wins over everything
    from orcasim.replay.scenario import build_scenario
    sc = build_scenario(LLAMA_4090, "meta.json", Path("w.jsonl"), profiles=None, gpu="rtx-4090",
                        num_gpu_blocks_override=2588)
    assert sc["policy"]["num_blocks"] == 2588 and "memory" not in sc


def test_kv_memory_falls_back_to_the_gpu_the_profiles_were_taken_on(tmp_path):
    meta = {k: v for k, v in LLAMA_4090.items() if k != "hardware"}
    prof = tmp_path / "p"
    prof.mkdir()
    (prof / "meta.yaml").write_text("hardware: RTX4090\ngpu: NVIDIA GeForce RTX 4090\n")
    # the rtx-4090 preset's memory as CUDA reports it, not its datasheet 24 GB
    mem, blocks = kv_sizing(meta, prof)
    assert mem["gpu_memory_gb"] == 25.250627584 and blocks == 2451
    # a GPU with no public CUDA figure: its datasheet capacity
    (prof / "meta.yaml").write_text("hardware: RTXPRO6000\n")
    assert kv_sizing(meta, prof)[0]["gpu_memory_gb"] == 96.0
    # --gpu-memory-gb is in GiB, the datasheet's unit: 24 GiB x 0.9 - 16.06 GB - 1.42 GiB
    assert kv_sizing(meta, prof, gpu_memory_gb=24)[1] == 2674


def test_kv_memory_sources_and_their_mistakes(tmp_path, capsys):
    from orcasim.hardware import get_gpu
    from orcasim.replay.scenario import kv_memory

    assert get_gpu("h100-sxm").vllm_memory_bytes == round(79.22 * 2**30)
    assert get_gpu("a100-40gb").vllm_memory_bytes == 40e9
    meta = {k: v for k, v in LLAMA_4090.items() if k != "hardware"}
    prof = tmp_path / "p"
    prof.mkdir()
    (prof / "meta.yaml").write_text("hardware: MyGPU\n")
    with pytest.raises(orcasim.UsageError, match="records no num_gpu_blocks and no "
                       "device_total_memory_bytes"):
        kv_memory(meta, "meta.json", gpu_memory_gb=None, gpu=None, profiles=prof)
    bad = {**meta, "hardware": {"device_total_memory_bytes": "24GB"}}
    with pytest.raises(orcasim.UsageError, match="must be a whole number of bytes"):
        kv_memory(bad, "meta.json", gpu_memory_gb=None, gpu=None, profiles=prof)


def test_replay_prints_the_kv_cache_it_gave_the_engine(tmp_path, capsys):
    run, workload, profile = make_run(tmp_path)
    args = ["replay-vllm", str(run), "--workload", str(workload), "--profiles", str(profile),
            "--no-plots"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "KV cache: 64 blocks of 16 tokens (the run's record)" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "b"), "--num-gpu-blocks", "48"]) == 0
    assert "KV cache: 48 blocks of 16 tokens (--num-gpu-blocks)" in capsys.readouterr().out
    sc = yaml.safe_load((tmp_path / "b" / "scenario.yaml").read_text())
    assert sc["policy"]["num_blocks"] == 48
    assert main([*args, "--out", str(tmp_path / "c"), "--num-gpu-blocks", "0"]) == 2
    assert "--num-gpu-blocks must be between 1" in capsys.readouterr().err


@needs_real
def test_the_real_gpu_page_table_is_what_the_replay_gives(tmp_path, capsys):
    """Every figure of the shipped run's table on docs/real-gpu.md, both latency models."""
    import re

    text = (ROOT / "docs" / "real-gpu.md").read_text().split("## Other measured runs")[0]
    rows = re.findall(r"^\| (TTFT|TPOT|E2E) (mean|median|p90|p99) \| ([\d,.]+) \| ([\d,.]+) \| "
                      r"([+-][\d.]+)% \| ([\d,.]+) \| ([+-][\d.]+)% \|$", text, re.M)
    assert len(rows) == 12
    base = ["replay-vllm", str(REAL / "vllm_runs" / "RTXPRO6000_Llama-3.1-8B"), "--workload",
            str(REAL / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"), "--no-plots"]
    got = {}
    for name, extra in (("profile", ["--profiles", str(REAL / "profiles" / "RTXPRO6000" /
                                                      "meta-llama" / "Llama-3.1-8B" / "bf16"),
                                     "--gpu-memory-gb", "96"]),
                        ("roofline", ["--gpu", "rtx-pro-6000", "--gpu-memory-gb", "96"])):
        assert main([*base, *extra, "--out", str(tmp_path / name)]) == 0
        got[name] = {r["metric"]: r for r in read_csv(tmp_path / name / "comparison.csv")}
    capsys.readouterr()

    def num(s: str) -> float:
        return float(s.replace(",", ""))

    for metric, stat, measured, prof, prof_err, roof, roof_err in rows:
        key = f"{metric.lower()}_{stat}_ms"
        digits = 1 if metric == "TPOT" else 0
        for name, value, err in (("profile", prof, prof_err), ("roofline", roof, roof_err)):
            r = got[name][key]
            assert round(float(r["measured"]), digits) == num(measured), key
            assert round(float(r["predicted"]), digits) == num(value), (name, key)
            assert f"{float(r['error_pct']):+.1f}" == err, (name, key)


def test_replay_sizes_the_kv_cache_from_memory_when_the_run_records_no_blocks(tmp_path, capsys):
    run, workload, profile = make_run(tmp_path, {"model": "meta-llama/Llama-3.1-8B",
                                                 "num_gpu_blocks": None})
    args = ["replay-vllm", str(run), "--workload", str(workload), "--profiles", str(profile),
            "--no-plots", "--gpu-memory-gb", "24"]
    assert main([*args, "--out", str(tmp_path / "a"), "--kv-reserve-gb", "2"]) == 0
    # (24 GiB x 0.9 - 16.06e9 - 2 GiB) // 2 MiB = 2,377 blocks
    assert ("KV cache: 2,377 blocks of 16 tokens (25.77 GB from --gpu-memory-gb 24 (GiB) x 0.9 "
            "- weights - 2.15 GB reserve)") in capsys.readouterr().out
    mem = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())["memory"]
    assert mem["gpu_memory_gb"] == 24 * 2**30 / 1e9
    assert mem["activation_reserve_gb"] == 2 * 2**30 / 1e9
    # the toy profile names no GPU and the run records no memory: nothing to size from
    assert main([*args[:-2], "--out", str(tmp_path / "b")]) == 2
    assert "give --gpu-memory-gb" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "c"), "--kv-reserve-gb", "-1"]) == 2
    assert "--kv-reserve-gb must be >= 0" in capsys.readouterr().err

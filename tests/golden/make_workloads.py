"""Write the random workloads of the vllm-v1 conformance tests (deterministic).

    python tests/golden/make_workloads.py [OUT_DIR]     # default tests/golden/vllm_v1
    python tests/golden/make_workloads.py --fuzz 500 /tmp/fuzz   # random ones, for a wider check

Each workload is a harness workload JSON (``{"config", "requests"}``); its golden
trace comes from vLLM itself, through the harness (see run_harness.py and
docs/vllm-v1.md). The workloads are drawn at random within a theme (memory
pressure, priority, shared prefixes, block sizes 8 and 32, long-prefill
threshold, async scheduling, chunked prefill off, watermark, admission without
reserving the full prompt, ...), not tuned to pass.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "vllm_v1"


def requests(rng: random.Random, n: int, *, span: int, prompt: tuple[int, int],
             output: tuple[int, int], prefixes: int = 0, prefix_len: tuple[int, int] = (0, 0),
             priorities: int = 0, prefix_share: float = 0.7, tag: str = "r") -> list[dict]:
    """``n`` requests arriving over ``span`` steps, some sharing system prompts."""
    plens = {f"sys{k}": rng.randint(*prefix_len) for k in range(prefixes)}
    out = []
    for i in range(n):
        r: dict[str, Any] = {"id": f"{tag}{i}", "arrival_step": rng.randint(0, span),
                             "prompt_len": rng.randint(*prompt), "output_len": rng.randint(*output)}
        if priorities:
            r["priority"] = rng.randrange(priorities)
        if prefixes and rng.random() < prefix_share:
            pid = rng.choice(sorted(plens))
            r["prefix_id"] = pid
            # sometimes a shorter or longer share of the same system prompt
            r["prefix_len"] = max(1, plens[pid] + rng.choice([0, 0, 0, -5, 3, 17]))
        out.append(r)
    return out


def pool_for(reqs: list[dict], block_size: int, share: float) -> int:
    """A pool of ``share`` of the blocks the requests would need all at once (+ the null block).

    Never smaller than the largest single request, which must fit alone.
    """
    need = [-(-(r["prompt_len"] + r["output_len"]) // block_size) for r in reqs]
    return max(max(need) + 2, int(share * sum(need))) + 1


def workloads() -> dict[str, dict]:
    out: dict[str, dict] = {}

    def add(name: str, seed: int, config: dict, **kw: Any) -> None:
        rng = random.Random(f"{name}:{seed}")
        reqs = requests(rng, **kw)
        share = config.pop("pool_share", None)
        if share is not None:
            config["num_blocks"] = pool_for(reqs, config.get("block_size", 16), share)
        out[name] = {"config": config, "requests": reqs}

    # memory pressure: recompute preemptions, head-of-line blocking
    add("pressure_bs8", 1, {"block_size": 8, "max_num_seqs": 8, "max_num_batched_tokens": 128,
                            "pool_share": 0.35},
        n=14, span=12, prompt=(20, 150), output=(20, 120))
    add("pressure_bs32", 2, {"block_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                             "pool_share": 0.4},
        n=14, span=10, prompt=(40, 300), output=(20, 150))
    add("pressure_async_bs8", 3, {"block_size": 8, "max_num_seqs": 6,
                                  "max_num_batched_tokens": 96, "async_scheduling": True,
                                  "pool_share": 0.35},
        n=12, span=15, prompt=(16, 120), output=(16, 100))
    add("pressure_prefix_bs16", 4, {"max_num_seqs": 10, "max_num_batched_tokens": 160,
                                    "pool_share": 0.3},
        n=16, span=20, prompt=(40, 200), output=(10, 80), prefixes=2, prefix_len=(30, 90))
    # priority policy
    add("priority_pressure", 5, {"policy": "priority", "max_num_seqs": 6,
                                 "max_num_batched_tokens": 128, "pool_share": 0.35},
        n=14, span=25, prompt=(30, 180), output=(20, 100), priorities=4)
    add("priority_async_prefix", 6, {"policy": "priority", "async_scheduling": True,
                                     "max_num_seqs": 6, "max_num_batched_tokens": 192,
                                     "pool_share": 0.35},
        n=14, span=25, prompt=(60, 200), output=(20, 90), priorities=3, prefixes=2,
        prefix_len=(32, 80))
    add("priority_bs8_threshold", 7, {"policy": "priority", "block_size": 8,
                                      "long_prefill_token_threshold": 40, "max_num_seqs": 5,
                                      "max_num_batched_tokens": 100, "pool_share": 0.4},
        n=12, span=30, prompt=(20, 160), output=(10, 70), priorities=5)
    # shared prefixes and the prefix cache
    add("shared_prefixes", 8, {"block_size": 16, "max_num_seqs": 12,
                               "max_num_batched_tokens": 256},
        n=20, span=30, prompt=(50, 260), output=(5, 40), prefixes=3, prefix_len=(16, 120),
        prefix_share=0.9)
    add("shared_prefixes_bs8_tight", 9, {"block_size": 8, "max_num_seqs": 10,
                                         "max_num_batched_tokens": 128, "pool_share": 0.3},
        n=18, span=25, prompt=(30, 160), output=(5, 60), prefixes=2, prefix_len=(20, 100),
        prefix_share=0.9)
    add("identical_prompts", 10, {"block_size": 8, "max_num_seqs": 6,
                                  "max_num_batched_tokens": 96, "pool_share": 0.4},
        n=10, span=8, prompt=(64, 64), output=(20, 60), prefixes=1, prefix_len=(64, 64),
        prefix_share=1.0)
    add("prefix_caching_off", 11, {"enable_prefix_caching": False, "max_num_seqs": 8,
                                   "max_num_batched_tokens": 192, "pool_share": 0.4},
        n=14, span=20, prompt=(40, 220), output=(10, 80), prefixes=2, prefix_len=(32, 96))
    # long-prefill threshold
    add("long_prefill_threshold", 12, {"long_prefill_token_threshold": 48, "max_num_seqs": 8,
                                       "max_num_batched_tokens": 200},
        n=12, span=20, prompt=(30, 500), output=(5, 40))
    add("long_prefill_async_bs32", 13, {"block_size": 32, "long_prefill_token_threshold": 64,
                                        "async_scheduling": True, "max_num_seqs": 8,
                                        "max_num_batched_tokens": 256, "pool_share": 0.5},
        n=12, span=20, prompt=(50, 600), output=(5, 50), prefixes=2, prefix_len=(64, 160))
    # async scheduling
    add("async_light", 14, {"async_scheduling": True, "max_num_seqs": 8,
                            "max_num_batched_tokens": 256},
        n=12, span=40, prompt=(10, 200), output=(1, 30))
    add("async_sparse_arrivals", 15, {"async_scheduling": True, "block_size": 8,
                                      "max_num_seqs": 4, "max_num_batched_tokens": 64},
        n=8, span=200, prompt=(4, 60), output=(1, 12))
    # chunked prefill off (the budget must cover max_model_len)
    add("no_chunked_prefill", 16, {"enable_chunked_prefill": False, "max_model_len": 512,
                                   "max_num_batched_tokens": 512, "max_num_seqs": 8,
                                   "pool_share": 0.4},
        n=14, span=20, prompt=(50, 400), output=(10, 100))
    add("no_chunked_prefill_async_priority", 17, {
        "enable_chunked_prefill": False, "async_scheduling": True, "policy": "priority",
        "max_model_len": 400, "max_num_batched_tokens": 400, "max_num_seqs": 6,
        "pool_share": 0.4},
        n=12, span=25, prompt=(40, 300), output=(10, 90), priorities=3, prefixes=1,
        prefix_len=(32, 64))
    # watermark
    add("watermark", 18, {"watermark": 0.1, "max_num_seqs": 8, "max_num_batched_tokens": 192,
                          "pool_share": 0.5},
        n=14, span=20, prompt=(40, 200), output=(10, 100), prefixes=2, prefix_len=(16, 64))
    add("watermark_async_bs8", 19, {"watermark": 0.05, "block_size": 8,
                                    "async_scheduling": True, "max_num_seqs": 6,
                                    "max_num_batched_tokens": 128, "pool_share": 0.45},
        n=12, span=20, prompt=(20, 150), output=(10, 80))
    # admission without reserving the whole prompt
    add("no_reserve_full_isl", 20, {"scheduler_reserve_full_isl": False, "max_num_seqs": 8,
                                    "max_num_batched_tokens": 96, "pool_share": 0.35},
        n=12, span=15, prompt=(60, 300), output=(10, 80))
    add("no_reserve_full_isl_async_priority", 21, {
        "scheduler_reserve_full_isl": False, "async_scheduling": True, "policy": "priority",
        "block_size": 8, "max_num_seqs": 6, "max_num_batched_tokens": 80, "pool_share": 0.35},
        n=12, span=20, prompt=(30, 200), output=(10, 70), priorities=3, prefixes=2,
        prefix_len=(16, 48))
    # caps: max_num_seqs, max_model_len (requests stop at the length cap)
    add("max_num_seqs_2", 22, {"max_num_seqs": 2, "max_num_batched_tokens": 128},
        n=10, span=10, prompt=(10, 200), output=(5, 40))
    add("max_model_len_cap", 23, {"max_model_len": 160, "block_size": 8, "max_num_seqs": 6,
                                  "max_num_batched_tokens": 128},
        n=10, span=10, prompt=(40, 150), output=(20, 120))
    add("burst", 24, {"max_num_seqs": 16, "max_num_batched_tokens": 512, "pool_share": 0.4},
        n=24, span=0, prompt=(10, 300), output=(5, 60), prefixes=2, prefix_len=(16, 64))

    # wholly random configurations
    for k in range(6):
        out[f"mixed_{k}"] = mixed(f"mixed:{k}")
    # the watermark applies only while something runs: big requests fit alone
    out["watermark_alone"] = {
        "config": {"num_blocks": 21, "watermark": 0.2, "max_num_seqs": 4,
                   "max_num_batched_tokens": 128},
        "requests": [
            {"id": "big0", "arrival_step": 0, "prompt_len": 250, "output_len": 30},
            {"id": "s1", "arrival_step": 1, "prompt_len": 20, "output_len": 10},
            {"id": "s2", "arrival_step": 3, "prompt_len": 40, "output_len": 6},
            {"id": "big3", "arrival_step": 60, "prompt_len": 260, "output_len": 20},
            {"id": "s4", "arrival_step": 61, "prompt_len": 10, "output_len": 5},
        ]}
    # three of 400 fuzz workloads, for paths the others miss: async decoding
    # stopped by max_model_len (108); a priority victim already scheduled in the
    # step gives its tokens back to the budget (204); a request preempted while
    # its last token is in flight finishes from the waiting queue (365)
    for k in (108, 204, 365):
        out[f"fuzz_{k}"] = mixed(f"fuzz:{k}")
    return out


def mixed(seed: str) -> dict:
    """A workload with a wholly random configuration (any knob, any mode)."""
    rng = random.Random(seed)
    bs = rng.choice([8, 16, 32])
    max_model_len = rng.choice([256, 512, 1024, 8192])
    chunked = rng.random() < 0.75
    batched = rng.choice([64, 128, 256]) if chunked else max(512, max_model_len)
    batched = min(batched, max_model_len)
    cfg: dict[str, Any] = {
        "block_size": bs,
        "max_num_seqs": min(rng.randint(2, 12), batched),
        "max_num_batched_tokens": batched,
        "enable_prefix_caching": rng.random() < 0.8,
        "policy": rng.choice(["fcfs", "priority"]),
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": rng.choice([0, 0, 16, 64]),
        "scheduler_reserve_full_isl": rng.random() < 0.7,
        "watermark": rng.choice([0.0, 0.0, 0.02, 0.1]),
        "max_model_len": max_model_len,
        "async_scheduling": rng.random() < 0.5,
    }
    reqs = requests(rng, rng.randint(8, 16), span=rng.choice([5, 20, 60]),
                    prompt=(5, min(400, max_model_len - 1)), output=(1, 120),
                    prefixes=rng.randint(0, 3), prefix_len=(8, 100), priorities=4, tag="m")
    if rng.random() < 0.7:  # else some requests run into max_model_len
        for r in reqs:
            r["output_len"] = max(1, min(r["output_len"], max_model_len - r["prompt_len"]))
    cfg["num_blocks"] = pool_for(reqs, bs, rng.choice([0.25, 0.4, 0.8, 2.0]))
    return {"config": cfg, "requests": reqs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=OUT)
    ap.add_argument("--fuzz", type=int, default=0, metavar="N",
                    help="write N wholly random workloads (fuzz_0 ...) instead of the golden set")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    wls = {f"fuzz_{k}": mixed(f"fuzz:{k}") for k in range(a.fuzz)} if a.fuzz else workloads()
    for name, wl in wls.items():
        (a.out / f"{name}.json").write_text(json.dumps(wl, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(wls)} workloads to {a.out}")


if __name__ == "__main__":
    main()

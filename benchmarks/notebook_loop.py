"""The seed notebook's simulator, transcribed and parametrised (workload, static, continuous, summary)."""
import numpy as np


def workload(n, lam, seed):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / lam, size=n))
    out = np.clip(rng.lognormal(mean=4.6, sigma=0.9, size=n).astype(int), 10, 2000)
    pro = np.clip(rng.lognormal(mean=4.0, sigma=0.7, size=n).astype(int), 5, 500)
    return [dict(arrival=float(arrivals[i]), idx=i, prompt_len=int(pro[i]), output_len=int(out[i]),
                 started_at=None, finished_at=None, tokens_done=0) for i in range(n)]

def lat(c):
    return lambda b, t: c[0] + c[1] * b + c[2] * t

def static(reqs, max_batch, step):
    pending = list(reqs); now = 0.0
    while pending:
        if pending[0]["arrival"] > now: now = pending[0]["arrival"]
        batch = []
        while pending and pending[0]["arrival"] <= now and len(batch) < max_batch:
            batch.append(pending.pop(0))
        for r in batch: r["started_at"] = now
        remaining = {r["idx"]: r["output_len"] for r in batch}
        while remaining:
            tot = sum(r["prompt_len"] + (r["output_len"] - remaining[r["idx"]]) for r in batch if r["idx"] in remaining)
            now += step(len(remaining), tot)
            for idx in list(remaining):
                remaining[idx] -= 1
                if remaining[idx] <= 0:
                    del remaining[idx]
                    next(r for r in batch if r["idx"] == idx)["finished_at"] = now

def continuous(reqs, max_batch, step):
    pending = list(reqs); active = []; now = 0.0
    while pending or active:
        while pending and pending[0]["arrival"] <= now and len(active) < max_batch:
            r = pending.pop(0); r["started_at"] = now; active.append(r)
        if not active:
            now = pending[0]["arrival"]; continue
        tot = sum(r["prompt_len"] + r["tokens_done"] for r in active)
        now += step(len(active), tot)
        for r in active: r["tokens_done"] += 1
        for r in active:
            if r["tokens_done"] >= r["output_len"]: r["finished_at"] = now
        active = [r for r in active if r["tokens_done"] < r["output_len"]]

def summarise(reqs):
    mk = max(r["finished_at"] for r in reqs)
    q = [r["started_at"] - r["arrival"] for r in reqs]
    e = [r["finished_at"] - r["arrival"] for r in reqs]
    return {"throughput_tok_s": sum(r["output_len"] for r in reqs) / mk,
            "queue_delay_p50": float(np.percentile(q, 50)), "queue_delay_p99": float(np.percentile(q, 99)),
            "e2e_p50": float(np.percentile(e, 50)), "e2e_p99": float(np.percentile(e, 99))}

def reference(n=500, lam=30.0, seed=0, max_batch=32, c=(0.005, 0.0008, 0.00002)):
    out = {}
    for name, fn in (("static", static), ("continuous", continuous)):
        reqs = workload(n, lam, seed); fn(reqs, max_batch, lat(c)); out[name] = summarise(reqs)
    return out

"""Disaggregated prefill and decode: prefill replicas compute prompts, decode replicas the rest.

With ``role: prefill`` and ``role: decode`` groups, the router sends each
request to a prefill replica, which runs it up to its first token (the
prompt, chunked as its policy does, and one sampled token). The request's KV
cache then moves to the decode replica with the fewest outstanding requests:

1. **Reservation.** The request holds its full prompt blocks on the prefill
   replica (a reference on each cached block) and waits, first come first
   served among transfers to that replica, until the decode replica's block
   pool can give it every block it needs to be scheduled there: its full
   prompt blocks (a reference on those it already caches, new blocks,
   evicting cached free ones, for the others) and one block for the last
   partial block and the next token. The wait is the request's
   ``kv_reserve_wait``.
2. **Transfer** over the cluster's ``link``: a SimPy resource with
   ``concurrency`` parallel transfers, each taking ``latency_s + prompt
   tokens x bytes per token / bandwidth`` (``kv_link_wait`` queueing for the
   link, ``kv_transfer_time`` on it). When it ends, the prefill replica's
   blocks are let go (they stay in its prefix cache) and the reserved full
   blocks carry the prompt's hashes in the decode replica's prefix cache.
3. **Decode.** The request joins the decode replica's queue and its
   reserved blocks go back to the free queue (the full ones cached, evicted
   last) without waking other reservations, so the decode scheduler sees
   them first: when it schedules the request (``decode_start``) it finds the
   full blocks as cached ones and computes only the last partial block and
   the token after the first. Blocks evicted before then (by requests ahead
   of it in the decode replica's own order, e.g. one preempted there) are
   recomputed. Holding them until then instead could deadlock: a request
   preempted on the decode replica waits at the head of its queue for
   blocks that the queued transfers behind it hold.

TTFT is the prefill replica's first token; the gap to the second token
(reservation, link queue, transfer and decode queue) counts as an
inter-token latency. A request needing more blocks than the decode
replica's whole pool reserves nothing (its blocks are recomputed there).

Both roles run ``vllm-v1`` (its block-level prefix cache receives the KV).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from orcasim.kv.block_pool import Block
from orcasim.metrics.recorder import Recorder
from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.cluster.config import LinkOptions
    from orcasim.cluster.model import ClusterModel, Replica

#: link presets: (bytes per second, latency in seconds)
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "nvlink": (450e9, 2e-6),
    "infiniband_400g": (50e9, 5e-6),
    "roce_100g": (12.5e9, 10e-6),
    "pcie_gen5": (64e9, 2e-6),
}


class HandoffRecorder(Recorder):
    """A prefill replica's recorder: a request that reaches its first token here is handed to
    the decode side instead of being recorded as finished."""

    handoff: Any = None  # (request) -> True if it was handed off

    def record_request(self, req: Request) -> None:
        if req.state == RequestState.FINISHED and self.handoff is not None and \
                self.handoff(req):
            return
        super().record_request(req)


class Disaggregation:
    """Moves requests from prefill to decode replicas over the link; counts transfers."""

    def __init__(self, model: ClusterModel, link: LinkOptions, bytes_per_token: int) -> None:
        self.model = model
        self.env = model.env
        bw, lat = LINK_PRESETS[link.preset] if link.preset is not None else (0.0, 0.0)
        self.bandwidth = link.bandwidth_gb_s * 1e9 if link.bandwidth_gb_s is not None else bw
        self.latency = link.latency_s if link.latency_s is not None else lat
        self.bytes_per_token = bytes_per_token
        self.link = simpy.Resource(self.env, capacity=link.concurrency)
        self.decode = [r for r in model.replicas if r.group.role == "decode"]
        self._output_len: dict[int, int] = {}
        self.num_transfers = 0
        self.transfer_bytes = 0
        self.transfer_time = 0.0
        self.link_wait = 0.0
        self.reserve_wait = 0.0
        #: transfers waiting for (or holding) each decode replica's reservation turn
        self._turn = {r.index: simpy.Resource(self.env, capacity=1) for r in self.decode}
        #: request id -> (replica, blocks) held on the decode replica until it is scheduled
        #: request id -> (prefill end, reservation wait, link wait, transfer time, decode start)
        self.times: dict[int, list[float]] = {}
        self._dest: dict[int, int] = {}  # request id -> its decode replica's index
        router = model.router
        router.dynamic = True  # a request in transfer is still on its way
        router.prepare = self._to_prefill
        for r in model.replicas:
            if r.group.role == "decode":
                router.view.set_available(r.index, False)  # arrivals go to prefill replicas
                r.ctx.on_admit = self._admitted
            else:
                assert isinstance(r.recorder, HandoffRecorder)
                r.recorder.handoff = self._handoff(r)

    def _to_prefill(self, req: Request) -> None:
        """Before a prefill replica gets ``req``: it runs to the first token only."""
        self._output_len[req.id] = req.output_len
        req.output_len = 1

    def _handoff(self, r: Replica) -> Any:
        router = self.model.router

        def handoff(req: Request) -> bool:
            out = self._output_len.pop(req.id)
            req.output_len = out
            if out <= 1 or req.reason is not None:  # done at the first token
                return False
            r.recorder.num_arrived -= 1  # it ends on a decode replica
            req.state = RequestState.WAITING
            req.finish = None
            req.num_computed_tokens = 0  # the decode replica counts its cached prefix itself
            router.total_outstanding += 1  # on its way (the prefill replica lets go of it)
            self.env.process(self._transfer(req, r, hold_prompt_blocks(r, req)))
            return True

        return handoff

    def _transfer(self, req: Request, src: Replica,
                  src_blocks: list[Block]) -> Generator[simpy.Event, Any, None]:
        router, env = self.model.router, self.env
        out = router.live_outstanding
        dest = min(self.decode, key=lambda d: (out[d.index], d.index))
        router.attach(dest.index, req)
        self._dest[req.id] = dest.index
        t0 = env.now
        with self._turn[dest.index].request() as turn:
            yield turn
            while True:
                held = reserve(dest, req)
                if held is not None:
                    break
                yield dest.ctx.kv.freed
        t1 = env.now
        with self.link.request() as slot:
            yield slot
            t2 = env.now
            size = req.prompt_len * self.bytes_per_token
            yield env.timeout(self.latency + size / self.bandwidth)
        self.num_transfers += 1
        self.transfer_bytes += size
        self.reserve_wait += t1 - t0
        self.link_wait += t2 - t1
        self.transfer_time += env.now - t2
        self.times[req.id] = [t0, t1 - t0, t2 - t1, env.now - t2, float("nan")]
        release(src, src_blocks)
        blocks, hashes, tail = held
        if tail:
            pool = dest.prefix_cache().pool
            for b, h in zip(blocks, hashes, strict=True):
                if b.block_hash is None:
                    pool.cache_block(b, h)
            # back to the free queue without waking the reservations waiting for memory:
            # the decode scheduler, woken by the arrival, sees the blocks first
            pool.free_blocks([*tail, *reversed(blocks)])
        dest.ctx.submit(req)

    def _admitted(self, req: Request) -> None:
        """A decode replica scheduled ``req``: the step it runs in starts at ``decode_start``."""
        t = self.times.get(req.id)
        if t is not None and t[4] != t[4]:
            t[4] = self._step_start(req)

    def _step_start(self, req: Request) -> float:
        ctx = self.model.replicas[self._dest[req.id]].ctx
        now = self.env.now
        return now if ctx.busy_until <= now else ctx.busy_until

    def request_columns(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Per-request stage times, in the order of ``ids`` (NaN for a request not
        transferred): ``kv_reserve_wait`` (for the decode replica's blocks),
        ``kv_link_wait``, ``kv_transfer_time`` and ``decode_start`` (the start of its first
        step on the decode replica)."""
        nan = [float("nan")] * 5
        rows = np.array([self.times.get(i, nan) for i in ids.tolist()],
                        dtype=np.float64).reshape(len(ids), 5)
        return {"kv_reserve_wait": rows[:, 1], "kv_link_wait": rows[:, 2],
                "kv_transfer_time": rows[:, 3], "decode_start": rows[:, 4]}

    def summary(self) -> dict[str, float]:
        """Transfers, their bytes, mean reservation wait, link wait and transfer time."""
        n = self.num_transfers
        nan = float("nan")
        return {"num_kv_transfers": n, "kv_transfer_bytes": self.transfer_bytes,
                "kv_reserve_wait_mean": self.reserve_wait / n if n else nan,
                "kv_transfer_wait_mean": self.link_wait / n if n else nan,
                "kv_transfer_time_mean": self.transfer_time / n if n else nan}


def _prompt_blocks(r: Replica, req: Request) -> tuple[Any, list[Any]]:
    """``r``'s cache manager and the hashes of ``req``'s full prompt blocks (those moved)."""
    mgr = r.prefix_cache()
    if mgr is None:
        return None, []
    mgr.update_hashes(req)
    hashes = mgr.hashes.get(req.id, [])[:(req.num_tokens - 1) // mgr.block_size]
    return mgr, hashes


def hold_prompt_blocks(r: Replica, req: Request) -> list[Block]:
    """Reference ``req``'s full prompt blocks still cached on prefill replica ``r`` (freed,
    and cached, when it finished its first token) so they stay until the transfer ends."""
    mgr, hashes = _prompt_blocks(r, req)
    if mgr is None:
        return []
    mgr.forget(req)
    pool = mgr.pool
    blocks = [b for b in map(pool.get_cached_block, hashes) if b is not None]
    pool.touch(blocks)
    return blocks


def reserve(r: Replica, req: Request) -> tuple[list[Block], list[Any], list[Block]] | None:
    """Take the blocks ``req`` needs to be scheduled on decode replica ``r``: a reference on
    its full prompt blocks already cached there, new blocks (evicting cached free ones) for
    the other full ones, and one new block for the last partial block and the next token.
    Returns (full blocks, their hashes, [tail block]), or ``None`` (nothing taken) if the
    pool cannot give them now. A request needing more blocks than the whole pool reserves
    nothing."""
    mgr, hashes = _prompt_blocks(r, req)
    if mgr is None:
        return [], [], []
    pool = mgr.pool
    if len(hashes) + 1 > pool.num_usable_blocks:
        return [], [], []
    cached = [pool.get_cached_block(h) for h in hashes]
    revived = sum(1 for b in cached if b is not None and b.ref_cnt == 0)
    missing = [i for i, b in enumerate(cached) if b is None]
    if pool.num_free_blocks - revived < len(missing) + 1:
        return None
    pool.touch([b for b in cached if b is not None])
    new = pool.get_new_blocks(len(missing) + 1)
    assert new is not None
    for i, b in zip(missing, new[:-1], strict=True):
        cached[i] = b
    return cached, hashes, new[-1:]  # type: ignore[return-value]


def release(r: Replica, blocks: list[Block]) -> None:
    """Let go of ``blocks`` held on ``r`` (they stay cached) and wake its memory waiters."""
    if blocks:
        r.prefix_cache().pool.free_blocks(reversed(blocks))
        r.ctx.kv.released()

"""Blocks holding a request's own tokens are named by (request, index), not interned.

The reference is the interning of every block (each ``(parent, content)`` pair
a fresh integer): both must give the same prefix-cache hits, schedules and
routing, while the new naming keeps the hasher's table to shareable content.
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.kv.cache_manager import KVCacheManager
from orcasim.kv.hashing import BlockHasher, block_content, is_unique, unique_block_id
from orcasim.request import Request


def _interning_update_hashes(self, req):
    """Every block interned by its content, as a reference."""
    if not self.enable_caching:
        return
    bs = self.block_size
    hashes = self.hashes.setdefault(req.id, [])
    parent = hashes[-1] if hashes else 0
    for i in range(len(hashes), req.num_tokens // bs):
        parent = self.hasher.block_id(parent, block_content(req, bs, i, shared_output=True))
        hashes.append(parent)


def _interning_lookup(self, parent, req, index, block_size):
    return self.lookup(parent, block_content(req, block_size, index, shared_output=True))


def _request(rid: int, prompt: int, prefix: str | None = None, prefix_len: int = 0) -> Request:
    r = Request(id=rid, arrival=0.0, prompt_len=prompt, output_len=40)
    r.prefix_id, r.prefix_len = prefix, prefix_len
    return r


def test_own_tokens_are_named_by_request_and_index():
    mgr = KVCacheManager(num_blocks=64, block_size=4)
    a = _request(7, 18, "sys", 9)  # blocks 0-1 shared, block 2 holds the prefix's end + own
    b = _request(8, 18, "sys", 9)
    mgr.update_hashes(a)
    mgr.update_hashes(b)
    ha, hb = mgr.hashes[7], mgr.hashes[8]
    assert ha[:2] == hb[:2] == [1, 2]  # interned: equal prefixes share identities
    assert ha[2:] == [unique_block_id(7, 2), unique_block_id(7, 3)]
    assert hb[2:] == [unique_block_id(8, 2), unique_block_id(8, 3)]
    assert len(mgr.hasher) == 2  # nothing of either request's own tokens is kept
    a.num_output_tokens = 10  # 28 tokens: 7 full blocks, all after the request's own tokens
    mgr.update_hashes(a)
    assert mgr.hashes[7][4:] == [unique_block_id(7, i) for i in (4, 5, 6)]
    assert len(mgr.hasher) == 2
    # forgotten and hashed again (a prefill replica handing over): the same identities
    first = list(mgr.hashes[7])
    mgr.forget(a)
    mgr.update_hashes(a)
    assert mgr.hashes[7] == first


def test_shared_output_of_a_fully_shared_prompt_stays_interned():
    # the stub model samples one token for everyone: equal prompts give equal outputs
    mgr = KVCacheManager(num_blocks=64, block_size=4)
    a, b = _request(1, 8, "p", 8), _request(2, 8, "p", 8)
    a.num_output_tokens = b.num_output_tokens = 8
    mgr.update_hashes(a)
    mgr.update_hashes(b)
    assert mgr.hashes[1] == mgr.hashes[2] == [1, 2, 3, 4]
    assert not is_unique(block_content(a, 4, 3, shared_output=True))
    assert is_unique(block_content(a, 4, 3))  # its own generated tokens


def test_lookup_never_interns():
    h = BlockHasher()
    r = _request(3, 12, "q", 4)
    assert h.request_lookup(0, r, 0, 4) is None  # shareable, never seen
    first = h.request_block_id(0, r, 0, 4)
    assert h.request_lookup(0, r, 0, 4) == first == 1
    assert h.request_lookup(first, r, 1, 4) == unique_block_id(3, 1)
    assert len(h) == 1


def _run(name: str, overrides: dict) -> dict:
    sc = orcasim.load_scenario(name).override(overrides)
    return orcasim.simulate(sc)


@pytest.mark.parametrize("name, overrides", [
    # a small cache: hits, evictions and preemptions with recomputation
    ("mooncake_prefix", {"workload.max_requests": 120, "policy.num_blocks": 6000,
                         "variants": None}),
    # prefix-aware routing reads the replicas' caches block by block
    ("cluster_prefix_routing", {"workload.max_requests": 120}),
])
def test_same_results_as_interning_every_block(monkeypatch, name, overrides):
    new = _run(name, overrides)
    with monkeypatch.context() as m:
        m.setattr(KVCacheManager, "update_hashes", _interning_update_hashes)
        m.setattr(BlockHasher, "request_lookup", _interning_lookup)
        ref = _run(name, overrides)
    assert new.summary == ref.summary
    a, b = new.requests, ref.requests
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(x, y)
        else:
            assert list(x) == list(y), col

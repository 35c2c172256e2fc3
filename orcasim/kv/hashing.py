"""Block content identities for prefix caching.

A full block's identity is chained over its predecessor's: two blocks match
only if they hold the same tokens *after the same prefix*. Instead of hashing
token ids (which a simulation does not have), callers describe a block's
content with any hashable key (a shared-prefix id and block index, a trace's
``hash_id``, a request id for unique content), and :class:`BlockHasher` turns
``(parent, content)`` into a small integer. Equal chains get equal ids, and
distinct chains never collide, so the prefix cache is exact and deterministic.

Where the real token ids are known, :func:`vllm_block_hashes` computes the
block hashes exactly as vLLM V1 does, for traces that carry token ids.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

#: index span of one request's unique block identities (:func:`unique_block_id`)
_UNIQUE_SPAN = 1 << 32


def unique_block_id(req_id: int, index: int) -> int:
    """The identity of block ``index`` of request ``req_id`` once its chain holds tokens
    unique to the request: a negative integer, fixed by the pair and never interned.

    Such a block can only ever match itself (the same request's same block, for
    instance after a preemption), so naming it by ``(request, index)`` is exact, and a
    long run keeps no entry per generated block.
    """
    return -(req_id * _UNIQUE_SPAN + index) - 1


def is_unique(content: tuple[Hashable, ...]) -> bool:
    """Whether a :func:`block_content` key holds tokens no other request has: a run of the
    request's own prompt tokens, or of its own generated ones (``shared_output`` off)."""
    for run in content:  # noqa: SIM110 (a loop: any() of a generator costs a frame per call)
        if run[0] == "u" or (run[0] == "o" and len(run) == 4):
            return True
    return False


def _own_or_content(parent: int, req: Any, index: int,
                    block_size: int) -> tuple[int | None, tuple[Hashable, ...]]:
    """``(unique_block_id, ())`` for a block of ``req`` from its own tokens on (after
    ``parent``), else ``(None, its shareable content key)``."""
    if parent < 0:
        return unique_block_id(req.id, index), ()
    content = block_content(req, block_size, index, shared_output=True)
    if is_unique(content):
        return unique_block_id(req.id, index), ()
    return None, content


class BlockHasher:
    """Interns ``(parent id, content key)`` pairs as consecutive integers (0 = no parent).

    Chains through tokens unique to one request are named by :func:`unique_block_id`
    instead (negative), so only content that other requests can share is interned.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def block_id(self, parent: int, content: Hashable) -> int:
        """The identity of a block holding ``content`` after the chain ``parent``."""
        key = (parent, content)
        ids = self._ids
        h = ids.get(key)
        if h is None:
            h = ids[key] = len(ids) + 1
        return h

    def lookup(self, parent: int, content: Hashable) -> int | None:
        """The identity of ``content`` after ``parent`` if it was ever interned (none added):
        a block never interned cannot be cached."""
        return self._ids.get((parent, content))

    def request_block_id(self, parent: int, req: Any, index: int, block_size: int) -> int:
        """The identity of block ``index`` of ``req`` after the chain ``parent``: interned
        while the chain holds only shareable content (:func:`block_content`, generated
        tokens shared), :func:`unique_block_id` from its first block of the request's
        own tokens on."""
        own, content = _own_or_content(parent, req, index, block_size)
        return own if own is not None else self.block_id(parent, content)

    def request_lookup(self, parent: int, req: Any, index: int, block_size: int) -> int | None:
        """:meth:`request_block_id` without interning: ``None`` for shareable content never
        interned, which no cache can hold."""
        own, content = _own_or_content(parent, req, index, block_size)
        return own if own is not None else self.lookup(parent, content)

    def chain(self, contents: Iterable[Hashable], parent: int = 0) -> list[int]:
        """Identities of consecutive blocks with the given contents."""
        out = []
        for c in contents:
            parent = self.block_id(parent, c)
            out.append(parent)
        return out


def block_content(
    req: Any, block_size: int, index: int, *, shared_output: bool = False
) -> tuple[Hashable, ...]:
    """The content key of block ``index`` of a request's token sequence.

    Token positions ``[index * block_size, (index + 1) * block_size)`` are
    described by runs of the request's attributes (duck-typed on
    :class:`~orcasim.request.Request`):

    - positions below ``prefix_len`` with a ``prefix_id``: the shared prefix;
    - prompt positions covered by ``hash_ids`` (one id per ``hash_block_size``
      tokens, as in the Mooncake traces): that hash block's tokens;
    - other prompt positions: tokens unique to the request;
    - positions at or after ``prompt_len``: generated tokens, unique to the
      request, or one token value shared by every request when
      ``shared_output`` (a stub model that always samples the same token).

    Two requests get equal keys for a block exactly when they hold the same
    tokens there; chained with :class:`BlockHasher`, equal chains mean equal
    prefixes.
    """
    start = index * block_size
    end = start + block_size
    prompt_len: int = req.prompt_len
    prefix_id = req.prefix_id
    prefix_len: int = min(req.prefix_len, prompt_len) if prefix_id is not None else 0
    hash_ids = req.hash_ids
    hbs: int = req.hash_block_size
    rid = req.id
    runs: list[tuple[Hashable, ...]] = []
    p = start
    while p < end:
        if p < prefix_len:
            q = min(end, prefix_len)
            runs.append(("p", prefix_id, p, q))
        elif p < prompt_len and hash_ids is not None and hbs > 0 and p // hbs < len(hash_ids):
            j = p // hbs
            q = min(end, prompt_len, (j + 1) * hbs)
            runs.append(("h", hash_ids[j], p - j * hbs, q - j * hbs))
        elif p < prompt_len:
            q = min(end, prompt_len)
            if hash_ids is not None and hbs > 0:  # stop where the next hash block starts
                q = min(q, max(p + 1, len(hash_ids) * hbs))
            runs.append(("u", rid, p, q))
        else:
            q = end
            runs.append(("o", q - p) if shared_output else ("o", rid, p, q))
        p = q
    return tuple(runs)


def _sha256_pickle(obj: object) -> bytes:
    """vLLM's default block hash (``prefix_caching_hash_algo: sha256``): SHA-256 of the pickle."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_block_hashes(token_ids: Sequence[int], block_size: int, seed: str = "0") -> list[bytes]:
    """vLLM V1's prefix-cache hashes of the full blocks of ``token_ids``.

    Block ``i`` hashes ``(hash of block i - 1, tuple of its token ids, None)``
    (``None``: no extra keys, i.e. no LoRA, multimodal input or cache salt),
    the first block's parent being ``NONE_HASH``, the hash of the string
    ``PYTHONHASHSEED`` (``seed``); the hash is SHA-256 of the pickled tuple,
    vLLM's default ``sha256`` algorithm (``hash_block_tokens`` and
    ``init_none_hash`` in ``vllm/v1/core/kv_cache_utils.py``, vLLM 0.10 to
    0.19). A partial last block is not hashed: vLLM caches full blocks only.
    """
    parent = _sha256_pickle(seed)
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _sha256_pickle((parent, tuple(token_ids[start:start + block_size]), None))
        out.append(parent)
    return out

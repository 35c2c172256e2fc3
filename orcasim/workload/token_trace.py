"""Token-id traces: request streams that carry each prompt's real token ids.

One JSON object per line, as written by LLMServingSim's ShareGPT generator
and served by ``vllm bench`` style clients::

    {"input_toks": 2358, "output_toks": 531, "arrival_time_ns": 46926808,
     "input_tok_ids": [5971, 2927, ...]}

``arrival_time_ns`` is nanoseconds from the start of the run (non-decreasing),
``input_toks`` must equal the number of ids, ``output_toks`` is the number of
tokens generated (at least 1). Other keys (``output_tok_ids``) are ignored.

Each prompt's full ``hash_block_size``-token blocks get vLLM's own prefix-cache
hashes (:func:`~orcasim.kv.hashing.vllm_block_hashes`), interned as small
integers in file order, so two requests share a block exactly when vLLM would
find it in its cache: same tokens after the same prefix. ``hash_block_size``
must therefore equal the engine's KV block size.
"""

from __future__ import annotations

from typing import Any

from orcasim.kv.hashing import vllm_block_hashes
from orcasim.workload.base import MAX_TOKENS_PER_REQUEST
from orcasim.workload.traces import (
    Trace,
    TraceError,
    block_trace,
    json_row,
)

#: keys every row must have
KEYS = ("input_toks", "output_toks", "arrival_time_ns", "input_tok_ids")


def load_token_trace(text: str, name: str, block_size: int) -> Trace:
    """The requests of a token-id trace, with vLLM block hashes (see the module docstring)."""
    stamps: list[Any] = []
    prompt: list[int] = []
    output: list[Any] = []
    hashes: list[tuple[int, ...]] = []
    lines: list[int] = []
    interned: dict[bytes, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        row = json_row(raw, name, lineno)
        for key in KEYS:
            if key not in row:
                raise TraceError(name, f"missing key {key!r}", lineno)
        ids = row["input_tok_ids"]
        if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
            raise TraceError(name, "input_tok_ids must be a list of whole numbers >= 0", lineno)
        if len(ids) > MAX_TOKENS_PER_REQUEST:
            raise TraceError(name, f"input_tok_ids: {len(ids)} tokens, more than "
                             f"{MAX_TOKENS_PER_REQUEST}", lineno)
        n_in = row["input_toks"]
        if n_in != len(ids):
            raise TraceError(name, f"input_toks is {n_in!r} but input_tok_ids has {len(ids)} "
                             "tokens", lineno)
        chain = vllm_block_hashes(ids, block_size)
        hashes.append(tuple(interned.setdefault(h, len(interned)) for h in chain))
        stamps.append(row["arrival_time_ns"])
        prompt.append(len(ids))
        output.append(row["output_toks"])
        lines.append(lineno)
    return block_trace(name, lines, ("arrival_time_ns", stamps, 1e9), ("input_toks", prompt),
                       ("output_toks", output), hashes, block_size)

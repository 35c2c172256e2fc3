"""ShareGPT-format conversations (the JSON file vLLM's serving benchmarks read) as a trace.

The file is a JSON list of conversations, each ``{"id": ..., "conversations":
[{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}``
(OpenAI-style ``{"role": "user", "content": ...}`` messages, under
``conversations`` or ``messages``, are read too).

Each user message answered by an assistant message is one *turn*: a row
with the conversation's number (``session``), the turn's number, the tokens
of the reply (``output_len``), the tokens the turn adds (``new_prompt_len``:
the user message, plus any messages since the previous reply) and the
whole context the model reads (``prompt_len``: every earlier message and the
new ones). Messages before the first user message (a system prompt) are
context of the first turn; user messages left unanswered at the end make no
turn; a conversation without any turn is counted in ``num_skipped``.

Tokens are counted with a ``tokenizers`` tokenizer file (``tokenizer.json``,
``pip install 'orcasim[tokenizers]'``) when one is given, without special
tokens or a chat template. Otherwise the count is an estimate: one token per
:data:`~orcasim.workload.traces.CHARS_PER_TOKEN` (4) characters, rounded up,
the usual rule of thumb for English text with GPT- and Llama-style BPE
vocabularies. An empty reply counts as one token (the end-of-sequence token).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from orcasim.workload.traces import CHARS_PER_TOKEN, Trace, TraceError

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})


def estimate_tokens(texts: list[str]) -> list[int]:
    """``ceil(characters / 4)`` per text: the estimate used without a tokenizer."""
    return [-(-len(t) // CHARS_PER_TOKEN) for t in texts]


def tokenizer_counter(path: str, source: str) -> Callable[[list[str]], list[int]]:
    """A function counting the tokens of each text with the ``tokenizers`` file at ``path``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TraceError(source, "counting tokens with a tokenizer file needs the 'tokenizers' "
                         "package: pip install 'orcasim[tokenizers]'") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises its own exception types
        raise TraceError(str(path), f"cannot load tokenizer: {err}") from None

    def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

    return count


def _messages(conv: Any, where: str, source: str) -> list[tuple[str, str]]:
    if not isinstance(conv, dict):
        raise TraceError(source, f"{where}: expected an object with 'conversations'")
    msgs = conv.get("conversations", conv.get("messages"))
    if not isinstance(msgs, list):
        raise TraceError(source, f"{where}: missing key 'conversations' (a list of messages)")
    out = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise TraceError(source, f"{where}, message {j}: expected an object")
        role = m.get("from", m.get("role"))
        text = m.get("value", m.get("content"))
        if not isinstance(role, str):
            raise TraceError(source, f"{where}, message {j}: missing 'from' (or 'role')")
        if not isinstance(text, str):
            raise TraceError(source, f"{where}, message {j}: 'value' (or 'content') must be text")
        out.append((role.lower(), text))
    return out


def load_sharegpt(text: str, source: str, tokenizer: str | None = None) -> Trace:
    """Parse ShareGPT JSON ``text`` into a per-turn :class:`Trace` (no arrival times)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise TraceError(source, "nested too deeply") from None
    except json.JSONDecodeError as err:
        raise TraceError(source, f"invalid JSON: {err.msg}", err.lineno) from None
    except ValueError:  # an integer of more digits than Python converts
        raise TraceError(source, "invalid JSON: a number has too many digits") from None
    if not isinstance(data, list):
        raise TraceError(source, "expected a JSON list of conversations", 1)
    convs = []
    texts: list[str] = []
    for i, conv in enumerate(data):
        cid = conv.get("id") if isinstance(conv, dict) else None
        where = f"conversation {i}" + (f" (id {cid!r})" if cid is not None else "")
        msgs = _messages(conv, where, source)
        convs.append([(role, len(texts) + k) for k, (role, _) in enumerate(msgs)])
        texts.extend(t for _, t in msgs)
    count = tokenizer_counter(tokenizer, source) if tokenizer else estimate_tokens
    ntok = count(texts) if texts else []
    session: list[int] = []
    turn: list[int] = []
    prompt: list[int] = []
    new: list[int] = []
    output: list[int] = []
    skipped = 0
    for i, msgs in enumerate(convs):
        context = 0  # tokens of everything before the pending messages
        pending = 0  # tokens since the last reply
        asked = False
        k = 0
        for role, idx in msgs:
            n = ntok[idx]
            if role in ASSISTANT_ROLES and asked:
                session.append(i)
                turn.append(k)
                new.append(pending)
                prompt.append(context + pending)
                output.append(max(1, n))
                context += pending + n
                pending = 0
                asked = False
                k += 1
            else:
                pending += n
                asked = asked or role in USER_ROLES
        if k == 0:
            skipped += 1
    if not output:
        raise TraceError(source, "no conversation has a user message answered by the assistant")
    return Trace(
        source=source,
        prompt_len=np.array(prompt, dtype=np.int64),
        output_len=np.array(output, dtype=np.int64),
        session=np.array(session, dtype=np.int64),
        turn=np.array(turn, dtype=np.int64),
        new_prompt_len=np.array(new, dtype=np.int64),
        num_skipped=skipped,
    )

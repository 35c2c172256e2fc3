"""The OpenAI-compatible request bodies ``orcasim serve`` reads and the bodies it answers.

Pure functions, no HTTP: :func:`parse_request` checks a ``/v1/completions`` or
``/v1/chat/completions`` body and turns it into a :class:`Completion` (prompt
and output lengths, streaming options), or raises :class:`ApiError` with the
status and OpenAI-style message to answer. The response builders write the
JSON objects vLLM's server writes, with placeholder text.

Lengths:

- prompt: the tokens of a tokenizer file when the server has one
  (``--tokenizer``, the ``tokenizers`` extra); else ``ceil(characters / 4)``
  of the prompt text. A chat request counts each message's text plus
  :data:`CHAT_TOKENS_PER_MESSAGE` tokens for its role and template markers.
  A completion prompt given as token ids counts its ids exactly.
- output: ``max_tokens`` (or ``max_completion_tokens``) exactly when
  ``ignore_eos`` is true; otherwise the next length of the scenario's
  workload, capped at ``max_tokens`` and raised to ``min_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from orcasim.workload.base import MAX_TOKENS_PER_REQUEST

#: characters per token of the estimate used without a tokenizer
CHARS_PER_TOKEN = 4
#: tokens a chat message costs beyond its text (role and template markers)
CHAT_TOKENS_PER_MESSAGE = 4
#: the text of one generated token: placeholder text, one token in common tokenizers
TOKEN_TEXT = " token"


class ApiError(Exception):
    """A request the server answers with an error: ``status`` and an OpenAI-style body."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
        429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}`` as OpenAI's API writes it."""
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class Completion:
    """A checked request: what the simulation needs and how to answer."""

    chat: bool
    model: str
    prompt_len: int
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    #: vLLM's ``stream_options.continuous_usage_stats``: usage so far in every chunk
    continuous_usage: bool = False

    def output_len(self, drawn: int) -> int:
        """The tokens to generate, given the next length ``drawn`` from the scenario."""
        if self.ignore_eos and self.max_tokens is not None:
            n = self.max_tokens
        else:
            n = drawn if self.max_tokens is None else min(drawn, self.max_tokens)
        n = max(n, self.min_tokens, 1)
        return n if self.max_tokens is None else min(n, self.max_tokens)

    def finish_reason(self, output_len: int) -> str:
        """``length`` when the output stops at ``max_tokens``, else ``stop`` (an end token)."""
        return "length" if output_len == self.max_tokens else "stop"


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: the prompt estimate without a tokenizer."""
    return -(-len(text) // CHARS_PER_TOKEN)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def _int(body: dict[str, Any], key: str, low: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer, got {json.dumps(v)[:40]}", key)
    if not low <= v <= MAX_TOKENS_PER_REQUEST:
        raise _bad(f"'{key}' must be in [{low}, {MAX_TOKENS_PER_REQUEST}], got {v}", key)
    return v


def _bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(f"'{key}' must be true or false, got {json.dumps(v)[:40]}", key)
    return v


def _text_tokens(text: str, count: Callable[[str], int] | None) -> int:
    return count(text) if count is not None else estimate_tokens(text)


def _prompt_len(prompt: Any, count: Callable[[str], int] | None) -> int:
    if isinstance(prompt, str):
        return _text_tokens(prompt, count)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt_len(prompt[0], count)  # a batch of one
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("a batch of several prompts is not simulated: send one prompt per request",
                   "prompt")
    raise _bad("'prompt' must be a string, a list of token ids, or a list of one of those",
               "prompt")


def _message_text(m: Any, i: int) -> str:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _bad(f"messages[{i}] must be an object with a string 'role'", "messages")
    content = m.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or \
                    not isinstance(p.get("text"), str):
                raise _bad(f"messages[{i}].content: only text parts are simulated", "messages")
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _chat_len(messages: Any, count: Callable[[str], int] | None) -> int:
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    total = 0
    for i, m in enumerate(messages):
        total += _text_tokens(_message_text(m, i), count) + CHAT_TOKENS_PER_MESSAGE
    return total


def parse_request(raw: bytes, *, chat: bool, models: Sequence[str],
                  count: Callable[[str], int] | None = None) -> Completion:
    """Check a request body; the :class:`Completion` it asks for, or an :class:`ApiError`.

    ``models``: the served model names (the first is the default when the body
    names none); ``count``: a tokenizer's token count of a text (``None``: the
    estimate).
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise _bad(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model", models[0])
    if not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    if model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    for key in ("n", "best_of"):
        v = body.get(key)
        if v is not None and v != 1:
            raise _bad(f"'{key}' = {json.dumps(v)[:40]}: only one completion per request is "
                       "simulated (n=1)", key)
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = continuous_usage = False
    if opts is not None:
        if not stream:
            raise _bad("'stream_options' can only be given with 'stream': true", "stream_options")
        if not isinstance(opts, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        include_usage = _bool(opts, "include_usage")
        continuous_usage = _bool(opts, "continuous_usage_stats")
    max_tokens = _int(body, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_completion_tokens", 1)
    min_tokens = _int(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise _bad(f"'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max_tokens})",
                   "min_tokens")
    if chat:
        prompt_len = _chat_len(body.get("messages"), count)
    else:
        if "prompt" not in body:
            raise _bad("'prompt' is required", "prompt")
        prompt_len = _prompt_len(body["prompt"], count)
        if prompt_len == 0:
            raise _bad("the prompt is empty", "prompt")
    if prompt_len > MAX_TOKENS_PER_REQUEST:
        raise _bad(f"the prompt has {prompt_len} tokens, more than {MAX_TOKENS_PER_REQUEST}",
                   "prompt")
    return Completion(chat=chat, model=model, prompt_len=prompt_len, max_tokens=max_tokens,
                      min_tokens=min_tokens, ignore_eos=_bool(body, "ignore_eos"),
                      stream=stream, include_usage=include_usage,
                      continuous_usage=continuous_usage)


# --- responses ---------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(c: Completion, rid: str, created: int, prompt_len: int, tokens: int,
                  finish_reason: str) -> dict[str, Any]:
    """The non-streaming answer with ``tokens`` placeholder tokens."""
    text = TOKEN_TEXT * tokens
    if c.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": c.model, "choices": [choice],
            "usage": usage(prompt_len, tokens)}


def chunk(c: Completion, rid: str, created: int, tokens: int,
          finish_reason: str | None = None, first: bool = False,
          so_far: tuple[int, int] | None = None) -> dict[str, Any]:
    """A streamed chunk carrying ``tokens`` new tokens (and the finish reason on the last);
    ``so_far``: (prompt, generated) tokens for the usage of ``continuous_usage_stats``."""
    text = TOKEN_TEXT * tokens
    if c.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else \
            ({"content": text} if tokens else {})
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": c.model, "choices": [choice]}
    if so_far is not None:
        out["usage"] = usage(*so_far)
    return out


#: stands for the text in :func:`chunk_template` (escaped by JSON, so no user string matches)
_SPLIT = "\x00text\x00"


def chunk_template(c: Completion, rid: str, created: int) -> tuple[bytes, bytes]:
    """``(prefix, suffix)`` such that ``prefix + text + suffix`` is the server-sent event of
    a middle chunk (not the first, not the last, no usage) carrying ``text``: built once
    per stream, so a chunk costs a concatenation instead of a JSON encoding."""
    body = chunk(c, rid, created, 1)
    choice = body["choices"][0]
    if c.chat:
        choice["delta"]["content"] = _SPLIT
    else:
        choice["text"] = _SPLIT
    prefix, _, suffix = sse(body).rpartition(json.dumps(_SPLIT)[1:-1].encode())
    return prefix, suffix


def usage_chunk(c: Completion, rid: str, created: int, prompt_len: int,
                tokens: int) -> dict[str, Any]:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if c.chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": c.model, "choices": [],
            "usage": usage(prompt_len, tokens)}


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event ``data: ...`` (``[DONE]`` as is)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


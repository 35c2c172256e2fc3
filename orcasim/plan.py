"""What one engine step does: the batch a policy hands to the engine.

A :class:`StepPlan` carries the aggregate quantities a latency model needs
(sequences, prefill and decode tokens, KV tokens read) and, for policies that
list them, the scheduled requests with their token counts. After the step the
policy fills in how many tokens were emitted, which the recorder turns into
inter-token-latency samples without storing tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from orcasim.request import Request


class StepPlan:
    """One step's batch.

    Attributes:
        num_seqs: sequences in the batch (B).
        num_prefill_tokens: prompt tokens computed this step.
        num_decode_tokens: generated-token positions computed this step.
        num_kv_tokens: tokens already in the KV cache that the step reads (T).
        scheduled: optional ``(request, num_tokens)`` pairs, for policies that list them.
        contexts: with ``scheduled``, the tokens each scheduled request had computed
            before the step (the context its new tokens attend to), for latency
            models that look at each sequence; None when the policy does not say.
            A policy may pass a function that lists them instead, called when they
            are first read (before the step's effects: the engine times a step
            before the policy applies it), so that a plan nobody asks for them
            costs nothing.
        num_singles: with ``scheduled``, how many of its first pairs compute one token
            each (0: not said), for latency models that count work per request.
        num_itl_tokens: set after the step: tokens emitted by sequences that also
            emitted in the previous step (each an inter-token gap of the step).
        swap_time: seconds of KV swapping (to or from CPU memory) the step also
            does; the engine adds it to the step's latency.
    """

    __slots__ = (
        "_contexts",
        "num_decode_tokens",
        "num_itl_tokens",
        "num_kv_tokens",
        "num_prefill_tokens",
        "num_seqs",
        "num_singles",
        "scheduled",
        "swap_time",
    )

    def __init__(
        self,
        num_seqs: int,
        num_kv_tokens: int,
        num_prefill_tokens: int = 0,
        num_decode_tokens: int | None = None,
        scheduled: list[tuple[Request, int]] | None = None,
        contexts: list[int] | Callable[[], list[int]] | None = None,
    ) -> None:
        self.num_seqs = num_seqs
        self.num_kv_tokens = num_kv_tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.num_decode_tokens = num_seqs if num_decode_tokens is None else num_decode_tokens
        self.scheduled = scheduled
        self._contexts = contexts
        self.num_singles = 0
        self.num_itl_tokens = 0
        self.swap_time = 0.0

    @property
    def contexts(self) -> list[int] | None:
        """The scheduled requests' contexts before the step (see the class), or None."""
        c = self._contexts
        if c is not None and not isinstance(c, list):
            c = self._contexts = c()
        return c

    @contexts.setter
    def contexts(self, value: list[int] | Callable[[], list[int]] | None) -> None:
        self._contexts = value

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step (prefill + decode)."""
        return self.num_prefill_tokens + self.num_decode_tokens

"""Closed-loop workloads: clients that wait for an answer, and multi-turn conversations.

Here a request is released by the end of an earlier one (see
``WorkloadArrays.after``), so the offered load depends on how fast the
system answers:

- ``closed_loop``: ``num_clients`` clients, each sending
  ``requests_per_client`` requests one at a time, thinking between the end
  of one and the start of the next;
- ``sessions``: conversations whose next turn comes a think time after the
  previous answer, with a prompt holding the whole conversation so far, and
  block ids (``hash_ids``) that let a prefix cache reuse it.

Lengths and think times are drawn before the run, so every variant sees the
same requests; only their arrival times depend on the policy.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import arrivals, lengths, workloads
from orcasim.spec import Nested
from orcasim.workload.attributes import ClassesField, apply_classes
from orcasim.workload.base import (
    LIMITS_NOTE,
    MAX_REQUESTS_PER_RUN,
    MAX_TOKENS_PER_REQUEST,
    TOKEN_LIMIT,
    RequestCount,
    Seconds,
    TokenCount,
    Workload,
    WorkloadArrays,
    field_error,
)
from orcasim.workload.distributions import (
    check_request_count,
    draw_arrivals,
    draw_lengths,
    refuse_empty_outputs,
)

#: the most prefix-cache block ids (``hash_ids``) a ``sessions`` workload may generate
MAX_HASH_IDS_PER_RUN = 100_000_000


class ThinkTime(ComponentParams):
    """Mixin: the pause between an answer and the next request."""

    think_time: Seconds = Field(1.0, description="mean think time, s (at most 1e9)")
    think_dist: Literal["exponential", "fixed"] = "exponential"

    def draw_think(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.think_dist == "fixed" or self.think_time == 0:
            return np.full(n, float(self.think_time))
        return rng.exponential(self.think_time, size=n)


@workloads.register("closed_loop")
class ClosedLoop(Workload):
    """``num_clients`` clients, each sending its next request a think time after the last ends.

    Client ``c``'s first request arrives at ``ramp_up * c / num_clients``;
    its ``k``-th request is request ``k * num_clients + c``. Columns are
    drawn in the order prompt lengths, output lengths, think times.
    """

    class Params(ThinkTime, ClassesField):
        num_clients: RequestCount = Field(description="clients (num_clients x "
                                          "requests_per_client at most 100,000,000)")
        requests_per_client: RequestCount = Field(description="requests each client sends")
        prompt_len: Annotated[Any, Nested(lengths)]
        output_len: Annotated[Any, Nested(lengths)]
        ramp_up: Seconds = Field(0.0, description="first requests spread over this long, s")

        _outputs = field_validator("output_len")(refuse_empty_outputs)

        @model_validator(mode="after")
        def _total(self) -> ClosedLoop.Params:
            n = self.num_clients * self.requests_per_client
            if n > MAX_REQUESTS_PER_RUN:
                raise field_error(("requests_per_client",), f"num_clients x requests_per_client "
                                  f"is {n:,} requests, more than the limit of "
                                  f"{MAX_REQUESTS_PER_RUN:,} per run (MAX_REQUESTS_PER_RUN)",
                                  self.requests_per_client)
            return self

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        c, m = p.num_clients, p.requests_per_client
        n = c * m
        prompt = draw_lengths(p.prompt_len, rng, n, "workload.prompt_len")
        output = draw_lengths(p.output_len, rng, n, "workload.output_len")
        think = p.draw_think(rng, n)
        idx = np.arange(n)
        after = np.where(idx >= c, idx - c, -1)
        arrival = np.full(n, np.nan)
        arrival[:c] = p.ramp_up * np.arange(c) / c
        think[:c] = 0.0
        out = WorkloadArrays(arrival=arrival, prompt_len=np.asarray(prompt, dtype=np.int64),
                             output_len=np.asarray(output, dtype=np.int64), after=after,
                             think=think)
        out.attrs["name"] = [f"c{i % c}.r{i // c}" for i in range(n)]
        return apply_classes(out, p.classes, rng, groups=idx % c)


@workloads.register("sessions")
class Sessions(Workload):
    """Multi-turn conversations: turn ``k + 1`` arrives a think time after turn ``k`` ends.

    Sessions start at the times of ``arrival``. Turn ``k``'s prompt is the
    system prompt, every earlier turn's input and output, and the turn's new
    input; its ``hash_ids`` (one per ``hash_block_size`` tokens) name the
    conversation's blocks, so the part a turn shares with the one before is
    a prefix-cache hit. Blocks wholly inside the system prompt are shared by
    all sessions. Lengths are drawn (``turns``, ``input_len``,
    ``output_len``) or read from a ShareGPT JSON ``file`` (one session per
    conversation, first ``num_sessions``).

    The simulator has no token values, so a cache holds a turn's *generated*
    tokens under the request's own identity: the next turn reuses the
    previous prompts' blocks, and recomputes the previous answer.
    """

    class Params(ThinkTime, ClassesField):
        num_sessions: int | None = Field(None, gt=0, le=MAX_REQUESTS_PER_RUN,
                                         description="default: every conversation in file "
                                         "(at most 100,000,000)")
        arrival: Annotated[Any, Nested(arrivals)]
        turns: Annotated[Any, Nested(lengths)] = Field(None, description="turns per session")
        input_len: Annotated[Any, Nested(lengths)] = Field(None, description="new tokens per turn")
        output_len: Annotated[Any, Nested(lengths)] = None
        file: str | None = Field(None, description="ShareGPT JSON conversations")
        tokenizer: str | None = Field(None, description="tokenizer.json to count file tokens")
        system_prompt_len: TokenCount = Field(0, description="tokens shared by every session "
                                              f"({LIMITS_NOTE})")
        hash_block_size: TokenCount = Field(16, gt=0, description="tokens per hash_ids entry")

        _outputs = field_validator("output_len")(refuse_empty_outputs)

        @model_validator(mode="after")
        def _source(self) -> Sessions.Params:
            drawn = [self.turns, self.input_len, self.output_len]
            if self.file is None:
                if any(d is None for d in drawn) or self.num_sessions is None:
                    raise ValueError("give num_sessions, turns, input_len and output_len, "
                                     "or a ShareGPT file")
            elif any(d is not None for d in drawn):
                raise ValueError("with file, turns and lengths come from the file: "
                                 "remove turns, input_len and output_len")
            return self

    def _drawn(self, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """Per turn: session, new input tokens, output tokens (drawn)."""
        p = self.params
        s = p.num_sessions
        turns = np.maximum(draw_lengths(p.turns, rng, s, "workload.turns"), 1)
        total = int(turns.sum())
        check_request_count(total, "workload.turns")
        new = draw_lengths(p.input_len, rng, total, "workload.input_len")
        out = np.maximum(draw_lengths(p.output_len, rng, total, "workload.output_len"), 1)
        return np.repeat(np.arange(s), turns), new, out

    def _from_file(self) -> tuple[np.ndarray, ...]:
        from orcasim.workload.traces import load_trace

        p = self.params
        tr = load_trace(p.file, "sharegpt", tokenizer=p.tokenizer)
        assert tr.session is not None and tr.new_prompt_len is not None
        convs, sess = np.unique(tr.session, return_inverse=True)
        if p.num_sessions is not None and p.num_sessions > len(convs):
            raise OrcasimError(f"{tr.source}: {len(convs)} conversations with turns, fewer "
                               f"than num_sessions ({p.num_sessions})")
        keep = sess < (p.num_sessions or len(convs))
        return sess[keep], tr.new_prompt_len[keep], tr.output_len[keep]

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        session, new, output = self._drawn(rng) if p.file is None else self._from_file()
        num_sessions = int(session[-1]) + 1
        n = len(session)
        starts = draw_arrivals(p.arrival, rng, num_sessions, "workload.arrival")
        think = p.draw_think(rng, n)
        # turn k's prompt: system + everything before it + its new input
        first = np.flatnonzero(np.r_[True, session[1:] != session[:-1]])
        step = new + output
        before = np.cumsum(step) - step
        before -= np.repeat(before[first], np.diff(np.r_[first, n]))
        prompt = p.system_prompt_len + before + new
        self._check_prompts(prompt, session, first)
        after = np.arange(n) - 1
        after[first] = -1
        think[first] = 0.0
        arrival = np.full(n, np.nan)
        arrival[first] = starts
        turn = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
        out = WorkloadArrays(arrival=arrival, prompt_len=prompt, output_len=output,
                             after=after, think=think)
        out.attrs["session"] = [f"s{s}" for s in session.tolist()]
        out.attrs["name"] = [f"s{s}.t{k}" for s, k in zip(session.tolist(), turn.tolist(),
                                                          strict=True)]
        out.attrs["hash_ids"] = self._hash_ids(session, prompt, first)
        out.attrs["hash_block_size"] = [p.hash_block_size] * n
        return apply_classes(out, p.classes, rng, groups=session)

    def _check_prompts(self, prompt: np.ndarray, session: np.ndarray, first: np.ndarray
                       ) -> None:
        """Refuse conversations that outgrow a request, or more block ids than a run may hold.

        A turn's prompt holds the whole conversation so far, so it can pass
        :data:`MAX_TOKENS_PER_REQUEST` although each drawn length is within it.
        """
        bad = np.flatnonzero(prompt > MAX_TOKENS_PER_REQUEST)
        if bad.size:
            k = int(bad[0])
            turn = k - int(first[np.searchsorted(first, k, side="right") - 1])
            raise ScenarioError("workload", f"session {int(session[k])}, turn {turn}: the "
                                f"conversation reaches {int(prompt[k]):,} prompt tokens, more "
                                f"than {TOKEN_LIMIT}: fewer turns or shorter lengths")
        bs = self.params.hash_block_size
        ids = int((-(-prompt // bs)).sum())
        if ids > MAX_HASH_IDS_PER_RUN:
            raise ScenarioError("workload.hash_block_size", f"the sessions' prompts need "
                                f"{ids:,} block ids (hash_ids), more than the limit of "
                                f"{MAX_HASH_IDS_PER_RUN:,}: use larger blocks or fewer turns")

    def _hash_ids(self, session: np.ndarray, prompt: np.ndarray, first: np.ndarray
                  ) -> list[list[int]]:
        """Block ids of each turn's prompt: shared system blocks, then the session's own."""
        bs = self.params.hash_block_size
        shared = self.params.system_prompt_len // bs
        ids: list[list[int]] = []
        base = shared
        ends = np.r_[first[1:], len(session)]
        for lo, hi in zip(first.tolist(), ends.tolist(), strict=True):
            longest = int(-(-int(prompt[hi - 1]) // bs))
            for k in range(lo, hi):
                nb = int(-(-int(prompt[k]) // bs))
                ids.append([j if j < shared else base + j - shared for j in range(nb)])
            base += max(0, longest - shared)
        return ids

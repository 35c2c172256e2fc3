"""A request's counters and timestamps while it is in the system.

A :class:`Request` is a plain mutable record: policies move it between the
waiting queue and the running batch and advance its counters; the recorder
copies its fields into columns when it reaches a final state, after which the
object can be dropped. Nothing here holds per-token data.
"""

from __future__ import annotations

from enum import IntEnum


class RequestState(IntEnum):
    """Where a request is. The last three are final: every request ends in exactly one."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    REJECTED = 4
    ABORTED = 5


FINAL_STATES = (RequestState.FINISHED, RequestState.REJECTED, RequestState.ABORTED)
_WAITING = RequestState.WAITING  # (a module constant: an enum's member is slow to look up)


class Request:
    """One inference request.

    ``prompt_len`` and ``output_len`` are token counts; ``output_len`` is the
    number of tokens the request will generate (known to the simulator, not to
    a realistic policy). ``num_output_tokens`` counts tokens generated so far;
    policies that advance many requests at once may keep it lazily and write it
    back when the request leaves the batch.
    """

    __slots__ = (
        "_batch_seq",
        "_done_at",
        "arrival",
        "beam_width",
        "cls",
        "deadline",
        "finish",
        "first_scheduled",
        "first_token",
        "hash_block_size",
        "hash_ids",
        "id",
        "last_token",
        "n",
        "name",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "output_len",
        "patience",
        "prefix_id",
        "prefix_len",
        "priority",
        "prompt_len",
        "reason",
        "session",
        "slot",
        "state",
        "tenant",
        "timeout",
    )

    #: attributes a workload may set per request (see ``WorkloadArrays.attrs``)
    WORKLOAD_ATTRS = (
        "name",
        "priority",
        "cls",
        "tenant",
        "deadline",
        "n",
        "beam_width",
        "prefix_id",
        "prefix_len",
        "hash_ids",
        "hash_block_size",
        "session",
        "patience",
        "timeout",
    )

    def __init__(
        self,
        id: int,
        arrival: float,
        prompt_len: int,
        output_len: int,
        name: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        deadline: float | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.priority = priority
        self.tenant = tenant
        self.deadline = deadline
        self.cls: str | None = None  # traffic / priority class name
        self.n = 1  # parallel samples
        self.beam_width = 1
        self.prefix_id: str | None = None  # shares its first prefix_len prompt tokens with others
        self.prefix_len = 0
        self.hash_ids: list[int] | None = None  # content ids of the prompt's hash blocks
        self.hash_block_size = 0  # tokens per hash_ids entry
        self.session: str | None = None  # multi-turn conversation id
        self.patience: float | None = None  # the client gives up without a first token by then
        self.timeout: float | None = None  # the client gives up without the end by then
        self.state = _WAITING
        self.reason: str | None = None
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish: float | None = None
        self.slot = -1
        self._batch_seq = -1
        self._done_at = 0

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus generated (an empty prompt counts as one start token)."""
        return (self.prompt_len or 1) + self.num_output_tokens

    @property
    def label(self) -> str:
        """The request's name if the workload gave one, else its numeric id."""
        return self.name if self.name is not None else str(self.id)

    def __repr__(self) -> str:
        return (
            f"Request({self.label}, arrival={self.arrival:g}, prompt={self.prompt_len}, "
            f"output={self.output_len}, state={self.state.name})"
        )

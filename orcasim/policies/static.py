"""``static``: request-level batching.

When the engine is empty, up to ``max_batch`` arrived requests form a batch,
which decodes until its longest member finishes. Slots freed by shorter
members stay empty until then. With a ``memory`` section, a batch is formed
of the requests whose memory fits (see :mod:`orcasim.policies.memory`).
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.base import slots_field
from orcasim.policies.memory import KVDecodePolicy, KVPolicyParams
from orcasim.registry import policies


@policies.register("static")
class Static(KVDecodePolicy):
    """Admit a new batch only when the previous one has completely finished."""

    runs_unchanged = True

    def has_room(self) -> bool:
        return not self.batch.size

    class Params(KVPolicyParams):
        max_batch: int = slots_field(32, "sequences per batch at most (batch slots)")
        prefill: bool = Field(False, description="charge each prompt as prefill in its first step")

    def admit(self) -> None:
        if self.batch.size:
            return
        if self.kv is not None:
            self.admit_fcfs()
            return
        self.join_fcfs(self.params.max_batch)

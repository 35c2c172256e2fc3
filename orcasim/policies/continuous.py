"""``continuous``: Orca's iteration-level batching.

At every step boundary, waiting requests join the batch first come, first
served, up to ``max_batch``; a request leaves the moment it emits its last
token, and its slot is refilled at the next boundary.

With a ``memory`` section in the scenario, a request also needs its KV
memory to join, and running requests that need a block they cannot get are
preempted (see :mod:`orcasim.policies.memory`).
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.base import slots_field
from orcasim.policies.memory import KVDecodePolicy, KVPolicyParams
from orcasim.registry import policies


@policies.register("continuous")
class Continuous(KVDecodePolicy):
    """Admit FCFS at every step boundary while the batch has a free slot."""

    runs_unchanged = True
    admits_every_step = True

    def has_room(self) -> bool:
        return self.batch.size < self.params.max_batch

    class Params(KVPolicyParams):
        max_batch: int = slots_field(32, "sequences per step at most (batch slots)")
        prefill: bool = Field(False, description="charge each prompt as prefill in its first step")

    def admit(self) -> None:
        if self.kv is not None:
            self.admit_fcfs()
            return
        self.join_fcfs(self.params.max_batch - self.batch.size)

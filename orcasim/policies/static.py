"""``static``: request-level batching.

When the engine is empty, up to ``max_batch`` arrived requests form a batch,
which decodes until its longest member finishes. Slots freed by shorter
members stay empty until then.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.base import DecodeOnlyPolicy, PolicyParams
from orcasim.registry import policies


@policies.register("static")
class Static(DecodeOnlyPolicy):
    """Admit a new batch only when the previous one has completely finished."""

    class Params(PolicyParams):
        max_batch: int = Field(32, gt=0, description="sequences per batch at most")
        prefill: bool = Field(False, description="charge each prompt as prefill in its first step")

    def admit(self) -> None:
        if self.batch.size:
            return
        waiting = self.ctx.waiting
        room = self.params.max_batch
        while waiting and room > 0:
            self.join(waiting.popleft())
            room -= 1

"""``decode-first``: running requests decode; new prompts wait until the batch drains.

The opposite of ``prefill-first``: while more than ``refill_below`` requests
are decoding, every step decodes them all and new requests wait. When the
batch has drained to ``refill_below`` (default 0: empty, as in request-level
batching with FasterTransformer), one step computes the prompts of as many
waiting requests as fit (first come, first served, whole prompts within the
token budget), and decoding resumes. Decodes never stall; new requests wait
long (TTFT) and the batch runs part-empty.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.base import slots_field
from orcasim.policies.common import BatchPolicy, MemoryParams
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("decode-first")
class DecodeFirst(BatchPolicy):
    """Decode steps while the batch is busy; refill it with a prompt step once it drains."""

    class Params(MemoryParams):
        max_batch: int = slots_field(32)
        token_budget: int = Field(2048, gt=0, description="prompt tokens per prefill step at most")
        refill_below: int = Field(0, ge=0, description="admit new prompts once at most this "
                                  "many requests are running")

    runs_unchanged = True

    def has_room(self) -> bool:
        return len(self.running) <= self.params.refill_below

    def schedule(self) -> list[tuple[Request, int]]:
        running = self.running
        if len(running) <= self.params.refill_below and self.ctx.waiting:
            scheduled: list[tuple[Request, int]] = []
            self.admit_waiting(scheduled, self.params.token_budget)
            if scheduled:
                return scheduled
        return self.schedule_running(self.decode_budget())[0]

    def decode_budget(self) -> int:
        return 1 << 62  # decode steps are not limited by the (prompt) token budget

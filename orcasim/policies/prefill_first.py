"""``prefill-first``: new prompts run alone and decodes wait (vLLM V0's default scheduler).

When waiting requests can be admitted (room in the batch, whole prompts
within the token budget, first come first served), the step computes only
their prompts, which emits their first tokens; the running requests' decodes
wait for that step. Otherwise every running request decodes one token. New
requests get a short TTFT; running ones see a long inter-token gap whenever
prompts arrive. A prompt larger than the token budget is rejected
(``prompt_too_long``).
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.base import slots_field
from orcasim.policies.common import BatchPolicy, MemoryParams
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("prefill-first")
class PrefillFirst(BatchPolicy):
    """Prompt-only steps whenever a new request can be admitted; decode steps otherwise."""

    runs_unchanged = True

    class Params(MemoryParams):
        max_batch: int = slots_field(32)
        token_budget: int = Field(2048, gt=0, description="prompt tokens per prefill step at most")

    def schedule(self) -> list[tuple[Request, int]]:
        scheduled: list[tuple[Request, int]] = []
        if self.ctx.waiting:
            self.admit_waiting(scheduled, self.params.token_budget)
            if scheduled:
                return scheduled
        return self.schedule_running(self.decode_budget())[0]

    def decode_budget(self) -> int:
        return 1 << 62  # decode steps are not limited by the (prompt) token budget

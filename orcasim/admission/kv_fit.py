"""``kv_fit``: admit a request only when its prompt fits in free KV memory.

Reads the run's KV memory (``ctx.kv``) through the read-outs every pool has:
``block_size``, ``num_free_blocks`` and ``num_usable_blocks``, the same on a
paged pool, a reservation pool (free slots in whole blocks) and the pool of
block objects that ``vllm-v1``'s cache manager allocates from. A run with
unlimited memory (no ``memory`` section) is an error, not a silent pass.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.admission.base import AdmissionController
from orcasim.context import SchedulerContext
from orcasim.errors import ScenarioError
from orcasim.kv.block_table import cdiv
from orcasim.params import ComponentParams
from orcasim.registry import admission
from orcasim.request import Request


@admission.register("kv_fit")
class KVFit(AdmissionController):
    """Reject (``kv_full``) a request whose prompt does not fit in the free KV blocks.

    A prompt larger than the whole pool is rejected with
    ``exceeds_kv_capacity``. With ``include_waiting``, the prompts already
    waiting count against the free blocks too (this scans the queue on every
    arrival, so combine it with ``max_queue``). ``headroom`` keeps that share
    of the pool free for the running requests' growth.
    """

    class Params(ComponentParams):
        include_waiting: bool = Field(False, description="count the waiting prompts as well")
        headroom: float = Field(0.0, ge=0, lt=1, description="share of the pool kept free")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        kv = ctx.kv
        if not kv.limited:
            raise ScenarioError("", "kv_fit needs a KV memory model, and this scenario "
                                "configures none (add a memory section)")
        self.kv = kv

    def blocks(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.kv.block_size)

    def check(self, req: Request) -> str | None:
        kv = self.kv
        need = self.blocks(req.prompt_len or 1)
        if need > kv.num_usable_blocks:
            return "exceeds_kv_capacity"
        if self.params.include_waiting:
            need += sum(self.blocks(r.prompt_len or 1) for r in self.ctx.waiting)
        free = kv.num_free_blocks - int(self.params.headroom * kv.num_usable_blocks)
        return "kv_full" if need > free else None

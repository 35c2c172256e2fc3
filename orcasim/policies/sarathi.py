"""``sarathi``: stall-free batching with chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024).

Every step has a token budget. Decoding requests are scheduled first, one
token each, so a long prompt never stalls the decodes (no generation stall);
then the prompts in progress, then new requests, in chunks that fill the
rest of the budget. A small budget keeps every step short (good TPOT) at the
price of spreading prompts over more steps (TTFT).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from orcasim.policies.common import ONE, BatchPolicy, TokenParams
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("sarathi")
class Sarathi(BatchPolicy):
    """Decodes first, prompt chunks fill the rest of a per-step token budget."""

    runs_unchanged = True

    class Params(TokenParams):
        token_budget: int = Field(512, gt=0, description="tokens computed per step at most")

    def pool_safe(self) -> bool:
        return True  # a member reads as it joined: a decode, as it is

    def decode_entries(self) -> list[tuple[Request, int]]:
        pool = self.pool
        running = self.running
        if pool is not None and pool.size == len(running):  # (order() gives them as they are)
            if pool.reqs == running:  # (the usual case: they joined the pool in that order)
                return pool.entries.copy()
            return list(zip(running, ONE, strict=False))
        return super().decode_entries()

    def order(self, reqs: list[Request]) -> Iterable[Request]:
        pool = self.pool
        if pool is not None and pool.size == len(reqs) and reqs is self.running:
            return reqs  # every one decodes together since the latest run
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in reqs:
            if req.num_output_tokens > 0 and req.num_computed_tokens == req.num_tokens - 1:
                decodes.append(req)
            else:
                prefills.append(req)
        return decodes + prefills if prefills else decodes

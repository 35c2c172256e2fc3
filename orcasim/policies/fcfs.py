"""``fcfs``: first come, first served at the token level, with chunked prefill.

Running requests get their tokens first, in the order they were admitted
(the rest of their prompt, or one decode token); waiting requests are
admitted in arrival order while the batch has room and the step's token
budget is not spent. This is vLLM V1's order without a memory limit, and the
baseline the other token-level policies are compared with.
"""

from __future__ import annotations

from orcasim.policies.common import BatchPolicy, TokenParams
from orcasim.registry import policies


@policies.register("fcfs")
class FCFS(BatchPolicy):
    """First come, first served; running requests first; chunked prefill within a token budget."""

    Params = TokenParams
    runs_unchanged = True

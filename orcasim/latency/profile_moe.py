"""The mixture-of-experts block of a profile: ``moe.csv`` against the step's tokens.

LLMServingSim's profiler times a whole MoE block (router gate plus the fused
experts) for ``tokens`` tokens routed so that ``activated_experts`` distinct
experts receive work (``tokens, activated_experts, time_us``; each token
picks ``experts_per_token`` experts, so ``activated_experts`` runs from
``experts_per_token`` to ``min(num_experts, tokens * experts_per_token)``).
A step's block time is that table at the step's tokens and the experts they
are expected to touch:

- ``uniform`` (default): tokens route independently and uniformly, as a gate
  trained with a load-balancing loss does on average; an expert is missed by
  one token with probability ``1 - k/E``, so ``E (1 - (1 - k/E)^N)`` experts
  are touched by ``N`` tokens (the roofline's count,
  :meth:`orcasim.hardware.ModelSpec.experts_touched`);
- ``balanced``: every expert-token pair lands on a different expert until all
  are busy, ``min(E, N k)`` (LLMServingSim's ``BALANCED`` routing: the most
  experts ``N`` tokens can touch).

The table is not a full grid, so it is interpolated axis by axis, activated
experts first, then tokens within each measured expert count (the block's
time is mostly the expert weights it reads, so the expert count is the axis
to bracket first).

MoE is profiled at tensor-parallel degree 1 only. At ``tp > 1`` without a
``moe.csv`` of its own, a profile borrows ``tp1/moe.csv`` with its times
divided by ``tp``: vLLM's fused MoE layer shards every expert's intermediate
dimension across the TP ranks (expert parallelism off, vLLM's default), so
each GPU reads and multiplies ``1/tp`` of every activated expert's weights.

**Expert parallelism** (``ep > 1``, vLLM's ``enable_expert_parallel`` with
``data_parallel_size`` = ``ep`` engines of TP1): each GPU holds ``E / ep``
whole experts, and every MoE layer gathers the tokens of all ``ep`` engines
(vLLM's default all2all backend, ``allgather_reducescatter``), so each GPU
runs its own experts on the expert-token pairs of all of them. With the
engines' steps of equal size (vLLM runs the DP engines of an MoE model in
lockstep and its load balancer keeps their queues even), a step of ``N``
tokens per engine sends ``N ep k / ep = N k`` pairs to each GPU's experts, of
which ``E/ep (1 - (1 - k/E)^(N ep))`` are touched under uniform routing
(``min(E/ep, N k)`` balanced): the TP1 table is read at ``N`` tokens and
that many experts. The all-gather and reduce-scatter around the block are
costed by the profile model (:meth:`ProfileLatency._ep_comm`). In a lockstep
group (:mod:`orcasim.cluster.lockstep`) the engines' steps need not be equal:
the table is then read at their mean tokens, ``N`` above
(:meth:`ProfileLatency.lockstep_time`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from orcasim.errors import ScenarioError
from orcasim.latency.profile_tables import build_nested, eval_nested, read_table

#: moe.csv's columns: (text columns, numeric columns)
MOE = ((), ("tokens", "activated_experts", "time_us"))

Routing = Literal["uniform", "balanced"]


def moe_file(directory: Path, tp: int) -> tuple[Path | None, float]:
    """The ``moe.csv`` a profile at ``tp`` uses and the factor on its times.

    ``tp<N>/moe.csv`` as measured; else, at ``tp > 1``, ``tp1/moe.csv`` over
    ``tp``; else ``(None, 1)`` (a dense model).
    """
    own = directory / f"tp{tp}" / "moe.csv"
    if own.is_file():
        return own, 1.0
    base = directory / "tp1" / "moe.csv"
    if tp > 1 and base.is_file():
        return base, 1.0 / tp
    return None, 1.0


def experts_touched(tokens: float, num_experts: int, experts_per_token: int,
                    routing: Routing, ep: int = 1) -> float:
    """Distinct experts of one GPU that a step of ``tokens`` tokens per engine is expected to
    route to, with the experts spread over ``ep`` GPUs and engines (see the module)."""
    e, k = num_experts, experts_per_token
    if tokens <= 0:
        return 0.0
    local = e / ep
    if routing == "balanced":
        return float(min(local, tokens * k))
    return local * (1.0 - (1.0 - k / e) ** (tokens * ep))


class MoeTable:
    """One MoE block's time, s, against the tokens of a step."""

    def __init__(self, path: Path, scale: float, num_experts: int, experts_per_token: int,
                 routing: Routing, clamp: bool, ep: int = 1) -> None:
        if experts_per_token > num_experts:
            raise ScenarioError("engine.latency.experts_per_token", f"{experts_per_token} is "
                                f"more than num_experts ({num_experts})")
        t = read_table(path, *MOE)
        keys = np.column_stack([t["activated_experts"], t["tokens"]])
        self.tree = build_nested(keys, t["time_us"] * (scale * 1e-6))
        self.num_experts = num_experts
        self.experts_per_token = experts_per_token
        self.routing: Routing = routing
        self.clamp = clamp
        if ep > 1 and num_experts % ep:
            raise ScenarioError("engine.latency.expert_parallel", f"{ep} does not divide "
                                f"num_experts ({num_experts})")
        self.ep = ep
        self._memo: dict[float, float] = {}

    def __call__(self, tokens: float) -> float:
        """The block's time for a step of ``tokens`` tokens (memoised per token count)."""
        t = self._memo.get(tokens)
        if t is None:
            a = experts_touched(tokens, self.num_experts, self.experts_per_token, self.routing,
                                self.ep)
            t = eval_nested(self.tree, (a, tokens), self.clamp) if tokens > 0 else 0.0
            self._memo[tokens] = t
        return t

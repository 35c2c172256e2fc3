"""When :class:`~orcasim.policies.kv_loop.KVDecodeLoop` may take an engine's runs.

The loop stands in for ``continuous``'s own methods with head-of-line
admission into a plain paged pool (:meth:`KVLoopCheck.applies`, checked once
per engine), and takes runs only while nothing waits on the pool and nothing
is swapped out (:meth:`KVLoopCheck.ready`, checked at each boundary it could
start from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orcasim.policies.decode_loop import FcfsDecodeLoop

if TYPE_CHECKING:
    from orcasim.engine import Engine


class KVLoopCheck:
    """:meth:`applies` and :meth:`ready`, for :class:`~orcasim.policies.kv_loop.KVDecodeLoop`."""

    enabled: bool
    kv: Any
    policy: Any

    @classmethod
    def applies(cls, engine: Engine) -> bool:
        """Whether ``engine`` may take its runs through this loop: ``continuous`` (its own
        methods) with head-of-line admission into a plain paged pool, counted
        (``counted_admission``), without prefill charging or processes, fed by a lazy
        open-loop source."""
        from orcasim.batch import DecodeBatch
        from orcasim.policies.base import DecodeOnlyPolicy
        from orcasim.policies.continuous import Continuous
        from orcasim.policies.kv_runs import KVDecodeRuns
        from orcasim.policies.memory import KVDecodePolicy
        from orcasim.source import Backlog, OpenLoopSource

        policy: Any = engine.policy
        if not (cls.enabled and isinstance(policy, KVDecodePolicy) and policy.kv is not None):
            return False
        kind = type(policy)
        ctx = engine.ctx
        own = all(getattr(kind, name) is getattr(base, name) for base, name in (
            (KVDecodePolicy, "ready_plan"), (KVDecodePolicy, "_prepare"),
            (KVDecodePolicy, "finished"), (KVDecodePolicy, "join"),
            (KVDecodePolicy, "admit_fcfs"), (KVDecodePolicy, "_admit_counted"),
            (KVDecodePolicy, "_refused_again"), (KVDecodePolicy, "room"),
            (KVDecodePolicy, "complete_step"), (KVDecodePolicy, "_grow_exact"),
            (KVDecodePolicy, "_preempt"), (KVDecodePolicy, "_victim"), (KVDecodeRuns, "decode_run"),
            (KVDecodeRuns, "complete_run"), (Continuous, "admit"), (Continuous, "has_room"),
            (DecodeOnlyPolicy, "_complete")))
        return (own and policy._counted and policy.growth is not None and not policy.prefill
                and policy._runs and not policy._listens and kind.admits_every_step
                and type(policy.batch) is DecodeBatch
                and type(ctx.source) is OpenLoopSource and ctx.source.lazy
                and type(ctx.waiting) is Backlog)

    def ready(self) -> bool:
        """As without memory, and nobody waits on the pool (a ``kv.get`` or ``kv.freed``) or
        is swapped out."""
        kv = self.kv
        policy: Any = self.policy
        return (not kv._getters and kv._freed is None and not policy._swapped
                and FcfsDecodeLoop.ready(self))

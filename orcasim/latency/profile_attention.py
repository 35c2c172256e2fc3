"""The attention part of the ``profile`` latency model: one layer's attention for a step.

The step's scheduled requests become the attention table's four inputs
(prefill chunk, its cached context, decoding sequences, their mean context),
read from LLMServingSim's ``attention.csv`` tree (with the skew correction for
uneven decode contexts) or from Vidur's prefill and decode tables.
:class:`~orcasim.latency.profile.ProfileLatency` loads the tables and adds
the dense, per-sequence and communication terms.
"""

from __future__ import annotations

import math
from typing import Any

from orcasim.latency.profile_tables import eval_nested
from orcasim.latency.skew import SkewFit
from orcasim.plan import StepPlan


class ProfileAttention:
    """Attention time from the loaded tables (set by :class:`ProfileLatency`'s ``__init__``)."""

    clamp: bool
    vidur: Any  # VidurTables | None
    skew: SkewFit | None
    attention_tree: Any

    def attention_inputs(self, plan: StepPlan) -> tuple[float, float, float, float]:
        """(prefill_chunk, kv_prefill, n_decode, kv_decode) of the step.

        A scheduled request computing one token is a decode (vLLM's attention
        backends split the batch the same way, by query length); its context is
        the tokens it had computed before the step (``plan.contexts``).

        The prefill chunks form one chunk of all their tokens ``C`` at the
        context that keeps the step's query-key pairs: FlashAttention's
        variable-length kernel attends each request's ``c`` new tokens to its
        own ``k`` cached ones and causally to each other, ``c (k + c / 2)``
        pairs, and never across requests. One chunk of ``C`` at context ``K``
        has ``C (K + C / 2)``, so ``K = sum c (k + c / 2) / C - C / 2``: the
        request's own context for a single chunk, less than the mean context
        for several (possibly below zero: :meth:`attention_time` then extends
        the table along as many tokens above zero). Decodes give their count
        and mean context. Without the
        scheduled requests, prefills have no cached context and decodes share
        the plan's KV tokens equally.
        """
        return self._inputs(plan)[:4]

    @staticmethod
    def _inputs(plan: StepPlan) -> tuple[float, float, float, float, float, float]:
        """:meth:`attention_inputs` plus the shortest and longest decode context."""
        if plan.scheduled is None:
            kd = plan.num_kv_tokens / plan.num_seqs if plan.num_seqs else 0.0
            return float(plan.num_prefill_tokens), 0.0, float(plan.num_decode_tokens), kd, kd, kd
        contexts = plan.contexts
        if contexts is None:
            contexts = [req.num_computed_tokens for req, _ in plan.scheduled]
        pc = kp = nd = kd = 0
        lo, hi = math.inf, 0
        for (_, n), c in zip(plan.scheduled, contexts, strict=True):
            if n == 1:
                nd += 1
                kd += c
                if c < lo:
                    lo = c
                if c > hi:
                    hi = c
            else:
                pc += n
                kp += n * (c + n / 2)
        mean = kd / nd if nd else 0.0
        return (float(pc), kp / pc - pc / 2 if pc else 0.0, float(nd), mean,
                float(lo) if nd else 0.0, float(hi))

    def attention_time(self, plan: StepPlan) -> float:
        """One layer's attention for the step, s, with the skew correction when it applies."""
        pc, kp, nd, kd, lo, hi = self._inputs(plan)
        clamp = self.clamp
        if self.vidur is not None:
            v = self.vidur
            t = eval_nested(v.prefill, (pc, kp), clamp) if pc else 0.0
            if nd:
                t += eval_nested(v.decode, (nd, kd), clamp)
            if v.kv_save is not None:
                t += v.kv_save(float(plan.num_prefill_tokens + plan.num_decode_tokens))
            return t
        t = self._table(pc, kp, nd, kd)
        skew = self.skew
        if skew is not None and nd > 1 and hi > kd:
            alpha = skew.alpha(pc, int(nd), kd, lo, hi, max(kp, 0.0))
            if alpha:
                t_max = self._table(pc, kp, nd, hi)
                if t_max > t:
                    t += alpha * (t_max - t)
        return t

    def _table(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """The attention table at (pc, kp, nd, kd), with kp below zero extended along [0, -kp].

        Several prefill chunks are costed as one chunk at a context ``kp`` that
        can fall below zero (:meth:`attention_inputs`). The table's time grows
        linearly with the cached context at a given chunk (the chunk's
        query-key pairs are ``pc (kp + pc / 2)``), so it is extended below
        zero with its slope over as many tokens as it goes below, ``T(0) -
        (T(-kp) - T(0))``, not with its first grid segment (0 to 16 tokens),
        whose slope is measurement noise.
        """
        tree = self.attention_tree
        if kp >= 0:
            return eval_nested(tree, (pc, kp, nd, kd), self.clamp)
        t0 = eval_nested(tree, (pc, 0.0, nd, kd), self.clamp)
        if self.clamp:
            return t0
        return 2 * t0 - eval_nested(tree, (pc, -kp, nd, kd), self.clamp)

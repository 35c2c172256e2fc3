"""Sequence groups that share KV blocks: parallel sampling and beam search, step by step.

A request with several output sequences keeps one block table per sequence
in a :class:`~orcasim.kv.block_table.BlockManager`; forks share blocks and
the first write into a shared, partly filled block copies it. Each group
advances one token per sequence per step, like a decode batch: at its step
``j`` a sequence holds ``P + j`` tokens (``P``: the prompt, at least 1).
A step is :meth:`grow` (take the blocks the step needs), then, after the
step has run, :meth:`finish_step` (free finished sequences).

- :class:`ParallelSampling`: ``n`` samples of one prompt. The prompt is
  computed once and forked, so the samples share the prompt's full blocks;
  the partly filled last prompt block is copied by each sample's first write.
  Each sample stops after its own output length.
- :class:`BeamSearch`: ``width`` beams for ``output_len`` steps. At every
  step new beam ``i`` extends beam ``i`` itself with probability ``keep``,
  otherwise a parent drawn uniformly from the current beams (``keep = 0``:
  the neutral Wright-Fisher model of which candidates survive); parents with
  several children are forked, parents with none are freed. Beams descending
  from a common ancestor share its blocks.

:meth:`step` returns the blocks the group's sequences would hold without
sharing during the step; :meth:`held_blocks` counts the distinct blocks they
hold with it. Pure data structures: no SimPy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from orcasim.kv.block_table import BlockManager, cdiv


class ParallelSampling:
    """``n`` samples of one prompt sharing its blocks (copy-on-write on first write)."""

    def __init__(self, manager: BlockManager, key: Hashable, prompt_len: int,
                 output_lens: Sequence[int]) -> None:
        self.m = manager
        self.key = key
        self.start = max(prompt_len, 1)
        self.output_lens = list(output_lens)
        self.j = 0
        self.live = [(key, i) for i in range(len(self.output_lens))]
        if not manager.allocate(self.live[0], self.start):
            raise MemoryError("the pool cannot hold the prompt")
        for s in self.live[1:]:
            manager.fork(self.live[0], s)

    @property
    def done(self) -> bool:
        return not self.live

    def held_blocks(self) -> int:
        """Distinct blocks the live samples hold."""
        return len({b.block_id for s in self.live for b in self.m.tables[s].blocks})

    def grow(self) -> int:
        """Bring every live sample to ``P + j`` tokens; blocks they would hold unshared."""
        m = self.m
        if self.j:
            for s in self.live:
                if not m.append(s, 1):
                    raise MemoryError("the pool ran out of blocks")
        return len(self.live) * cdiv(self.start + self.j, m.block_size)

    def finish_step(self) -> None:
        """Step ``j`` ran: samples that emitted their last token free their blocks."""
        self.j += 1
        keep = []
        for s in self.live:
            if self.output_lens[s[1]] <= self.j:
                self.m.free(s)
            else:
                keep.append(s)
        self.live = keep


class BeamSearch:
    """``width`` beams, each step re-drawn from the current beams as parents."""

    def __init__(self, manager: BlockManager, key: Hashable, prompt_len: int, output_len: int,
                 width: int, rng: np.random.Generator, keep: float = 0.0) -> None:
        if width < 1 or output_len < 1:
            raise ValueError("width and output_len must be >= 1")
        if not 0 <= keep <= 1:
            raise ValueError("keep must be in [0, 1]")
        self.m = manager
        self.key = key
        self.start = max(prompt_len, 1)
        self.output_len = output_len
        self.width = width
        self.rng = rng
        self.keep = keep
        self.j = 0
        self.n = 0  # sequence counter
        first = self._new()
        if not manager.allocate(first, self.start):
            raise MemoryError("the pool cannot hold the prompt")
        self.beams = [first]
        for _ in range(width - 1):  # the first step's beams all extend the prompt
            s = self._new()
            manager.fork(first, s)
            self.beams.append(s)

    def _new(self) -> tuple[Hashable, int]:
        self.n += 1
        return (self.key, self.n)

    @property
    def done(self) -> bool:
        return not self.beams

    def held_blocks(self) -> int:
        """Distinct blocks the beams hold."""
        return len({b.block_id for s in self.beams for b in self.m.tables[s].blocks})

    def grow(self) -> int:
        """Re-draw the beams from their parents and bring them to ``P + j`` tokens.

        Returns the blocks the beams would hold unshared.
        """
        m = self.m
        if self.j:
            w = self.width
            rng = self.rng
            uniform = rng.integers(0, w, size=w)
            own = rng.random(w) < self.keep
            parents = np.where(own, np.arange(w), uniform)
            children = []
            for i in np.sort(parents).tolist():
                c = self._new()
                m.fork(self.beams[i], c)
                children.append(c)
            for s in self.beams:
                m.free(s)
            for c in children:
                if not m.append(c, 1):
                    raise MemoryError("the pool ran out of blocks")
            self.beams = children
        return self.width * cdiv(self.start + self.j, m.block_size)

    def finish_step(self) -> None:
        """Step ``j`` ran: after the last one every beam frees its blocks."""
        self.j += 1
        if self.j >= self.output_len:
            for s in self.beams:
                self.m.free(s)
            self.beams = []

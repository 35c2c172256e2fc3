"""Parallel sampling and beam search on shared blocks: hand-checked block counts, and the study."""

from __future__ import annotations

import numpy as np

from orcasim.kv import BlockPool
from orcasim.kv.block_table import BlockManager
from orcasim.kv.sharing import BeamSearch, ParallelSampling
from orcasim.studies.sharing import memory_saving


def run(group, m):
    held, logical = [], []
    while not group.done:
        logical.append(group.grow())
        held.append(group.held_blocks())
        assert held[-1] == m.pool.num_held_blocks
        m.check()
        group.finish_step()
    assert m.pool.num_free_blocks == m.pool.num_usable_blocks
    return held, logical


def test_parallel_samples_share_full_prompt_blocks_and_copy_the_partial_one():
    m = BlockManager(BlockPool(16, 4, enable_caching=False))
    # prompt 6 = one full block + 2 tokens; samples of 3 and 2 output tokens
    held, logical = run(ParallelSampling(m, "r", 6, [3, 2]), m)
    # step 0: both share both prompt blocks; step 1: the first writer copies the partial
    # block, the second writes in place; step 2: the 2-token sample has finished
    assert held == [2, 3, 2] and logical == [4, 4, 2]
    assert m.num_cow_copies == 1


class FixedDraws:
    """A stand-in generator: every beam draws parent 0, never keeps its own lineage."""

    def integers(self, low, high, size):
        return np.zeros(size, dtype=np.int64)

    def random(self, size):
        return np.ones(size)


def test_beams_descending_from_one_parent_share_its_blocks():
    m = BlockManager(BlockPool(16, 4, enable_caching=False))
    held, logical = run(BeamSearch(m, "r", 4, 3, 2, FixedDraws(), keep=0.0), m)
    # step 1: both children of beam 0 start a new block each after the full prompt block;
    # step 2: both children of the first beam share its partial block: one copies it
    assert held == [1, 3, 3] and logical == [2, 4, 4]
    assert m.num_cow_copies == 1


def test_beams_that_keep_their_lineage_share_only_the_prompt():
    m = BlockManager(BlockPool(16, 4, enable_caching=False))
    held, logical = run(BeamSearch(m, "r", 4, 3, 2, np.random.default_rng(0), keep=1.0), m)
    assert held == [1, 3, 3] and logical == [2, 4, 4]
    assert m.num_cow_copies == 0


def test_sharing_study_savings():
    par = memory_saving("parallel", 4, 200, seed=1)
    beam = memory_saving("beam", 4, 200, seed=1)
    assert 0 < par["saving"] < beam["saving"] < 0.75  # width 4 saves at most 3/4
    assert memory_saving("parallel", 1, 50)["saving"] == 0.0  # one sample shares nothing
    again = memory_saving("beam", 4, 200, seed=1)
    assert again == beam  # same seed, same numbers

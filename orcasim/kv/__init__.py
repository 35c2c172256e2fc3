"""KV-cache memory: a PagedAttention block pool and its helpers (pure data structures, no SimPy)."""

from orcasim.kv.block_pool import Block, BlockPool, FreeBlockQueue
from orcasim.kv.hashing import BlockHasher, block_content

__all__ = ["Block", "BlockHasher", "BlockPool", "FreeBlockQueue", "block_content"]

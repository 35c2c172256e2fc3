"""Block content identities for prefix caching.

A full block's identity is chained over its predecessor's: two blocks match
only if they hold the same tokens *after the same prefix*. Instead of hashing
token ids (which a simulation does not have), callers describe a block's
content with any hashable key (a shared-prefix id and block index, a trace's
``hash_id``, a request id for unique content), and :class:`BlockHasher` turns
``(parent, content)`` into a small integer. Equal chains get equal ids, and
distinct chains never collide, so the prefix cache is exact and deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class BlockHasher:
    """Interns ``(parent id, content key)`` pairs as consecutive integers (0 = no parent)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def block_id(self, parent: int, content: Hashable) -> int:
        """The identity of a block holding ``content`` after the chain ``parent``."""
        key = (parent, content)
        ids = self._ids
        h = ids.get(key)
        if h is None:
            h = ids[key] = len(ids) + 1
        return h

    def chain(self, contents: Iterable[Hashable], parent: int = 0) -> list[int]:
        """Identities of consecutive blocks with the given contents."""
        out = []
        for c in contents:
            parent = self.block_id(parent, c)
            out.append(parent)
        return out

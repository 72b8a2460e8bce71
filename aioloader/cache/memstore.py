"""A memory cache's entries: append-only regions of anonymous memory in the process that
reads the samples (the loader process, or the trainer's in-process), so they are counted
once in the memory of the process tree, whatever the number of workers.

Entries are never evicted, so a bump allocator over 64 MiB regions is all it takes: no
fragmentation, no per-entry object in Python's heap, and the bytes held are exact. A region
is anonymous ``mmap`` memory: its pages are taken when written, and all of it goes back to
the system at :meth:`MemoryStore.close` (malloc would keep freed pages in its arenas).
Loop-bound: one thread uses it.
"""

from __future__ import annotations

import mmap

__all__ = ["REGION", "MemoryStore"]

#: Bytes per region; an entry larger than this gets a region of its own.
REGION = 64 << 20


class MemoryStore:
    """Entries by key, at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        #: Bytes of entries held.
        self.held = 0
        self._regions: list[mmap.mmap] = []
        self._used = 0  # in the last region
        self._where: dict[str, tuple[int, int, int]] = {}  # key -> (region, offset, length)

    def __len__(self) -> int:
        return len(self._where)

    def room(self, size: int = 1) -> bool:
        """Whether ``size`` more bytes stay within the bound."""
        return self.held + size <= self.max_bytes

    def get(self, key: str) -> memoryview | None:
        """The entry's bytes (a view valid until :meth:`close`), or None."""
        at = self._where.get(key)
        if at is None:
            return None
        region, offset, length = at
        return memoryview(self._regions[region])[offset : offset + length]

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Keep ``data`` under ``key``; False when it would pass the bound (nothing kept).
        A key already held keeps its first entry (the same bytes)."""
        n = len(data)
        if key in self._where:
            return True
        if not self.room(n):
            return False
        if not self._regions or self._used + n > len(self._regions[-1]):
            self._regions.append(mmap.mmap(-1, max(REGION, n)))
            self._used = 0
        region = self._regions[-1]
        region[self._used : self._used + n] = data
        self._where[key] = (len(self._regions) - 1, self._used, n)
        self._used += n
        self.held += n
        return True

    def close(self) -> None:
        """Give every region back (views from :meth:`get` must be gone)."""
        self._where.clear()
        regions, self._regions = self._regions, []
        for region in regions:
            try:
                region.close()
            except BufferError:  # a view still lives: garbage collection unmaps it
                pass
        self.held = 0

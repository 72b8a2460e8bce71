"""A tar shard read where its parser reads, for its index: in ranges of :data:`CHUNK` bytes
front to back, the next asked for while the parser reads this one, so that a shard of small
members (images) is one pass; a skip only moves the position, and one that lands more than
:data:`JUMP` bytes past what was fetched (a member larger than that: a video, a
high-resolution scan) asks for the bytes where it landed, :data:`AFTER_JUMP` of them, instead
of reading what it passes over: streaming past a member costs its bytes, a new read one round
trip. A remote shard's scan reads through it (:mod:`aioloader.read.tarindex`): one pass
front to back where that is cheaper (small members: 4-50x a GET a member at 0-20 ms a
request), a GET a member where that is (members over a megabyte: ``benchmarks/tar_index.py``).
A shard is never held whole: two ranges at most.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

__all__ = ["AFTER_JUMP", "CHUNK", "JUMP", "WAIT", "Ranges"]

#: Bytes a range is, read front to back: a GET's (a request's latency is paid once for it).
CHUNK = 8 << 20
#: Bytes past what was fetched beyond which a skip starts a new GET where it lands, rather
#: than wait for them to stream by: a round trip costs less than that many bytes at the
#: bandwidth of a bucket's stream (20-50 ms at 50-100 MB/s: 1-5 MB).
JUMP = 1 << 20
#: Bytes a GET asks for after a jump: a header, a label, the next header.
AFTER_JUMP = 64 << 10
#: Seconds a parser waits for a range before the shard is given up.
WAIT = 300.0


class Ranges:
    """A remote shard as :func:`~aioloader.read.tarscan.scan` reads it (the module's
    docstring): ``fetch(start, end)`` gives a future of those bytes (a GET on a loop);
    ``size`` is the shard's, ``shown`` names it in errors."""

    def __init__(self, fetch: Callable[[int, int], Future[bytes]], size: int, shown: str) -> None:
        self._fetch, self._size, self._shown = fetch, size, shown
        self._pos = 0
        self._buf, self._at = b"", 0  # bytes [_at, _at + len(_buf)) of the shard
        self._ahead: tuple[int, Future[bytes]] | None = None  # the next GET: where, its bytes

    def read(self, n: int) -> bytes:
        end, parts = min(self._pos + n, self._size), []
        while self._pos < end:
            if not self._at <= self._pos < self._at + len(self._buf):
                self._refill()
            off = self._pos - self._at
            part = self._buf[off : off + end - self._pos]
            parts.append(part)
            self._pos += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n: int) -> int:
        """Move past ``n`` bytes; how many there were before the shard's end."""
        n = max(0, min(n, self._size - self._pos))
        self._pos += n
        return n

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def _refill(self) -> None:
        """The bytes from the position on: the GET ahead's where the position is at most
        :data:`JUMP` bytes into it, else a new GET's. Reading on front to back, a range is
        :data:`CHUNK` bytes and the next is asked for ahead (not after the first: a small
        shard is one GET); after a jump (members larger than that: the next read is likely a
        jump too) a range is :data:`AFTER_JUMP` bytes and none is asked ahead."""
        ahead, self._ahead = self._ahead, None
        # None ahead of the first range: a shard of large members is known after it, and a
        # GET ahead dropped mid-way costs its connection.
        fetched = self._at + len(self._buf)
        onward = fetched > 0 and self._pos - fetched < JUMP
        size = CHUNK if onward or not fetched else AFTER_JUMP
        if ahead is not None and ahead[0] <= self._pos < ahead[0] + JUMP:
            start, got, onward = ahead[0], ahead[1], True
        else:
            if ahead is not None:
                ahead[1].cancel()
            start, got = self._pos, self._get(self._pos, size)
        self._buf, self._at = self._wait(got, start), start
        following = start + len(self._buf)
        if self._pos >= following:
            raise OSError(
                f"{self._shown}: {len(self._buf)} bytes at byte {start}, short of {self._pos} (changed?)"
            )
        if onward and following < self._size:
            self._ahead = (following, self._get(following, CHUNK))

    def _get(self, start: int, size: int) -> Future[bytes]:
        return self._fetch(start, min(start + size, self._size))

    def _wait(self, got: Future[bytes], start: int) -> bytes:
        try:
            return got.result(timeout=WAIT)
        except FutureTimeout:
            raise TimeoutError(f"{self._shown}: no answer for {WAIT:.0f} s at byte {start}") from None
        except Exception as exc:  # noqa: BLE001 - any client's error, named
            raise OSError(f"{self._shown}: {exc}") from None

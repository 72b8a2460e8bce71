"""A disk cache's entries: one file per entry under the cache's folder
(:func:`~aioloader.cache.entries.relpath`), in the format of :mod:`aioloader.cache.entries`.

**Consistent after a SIGKILL at any moment.** An entry is written to a temporary name in
its sub-folder (``.tmp-<pid>-<key>``, created exclusively), then renamed over its name: a
reader sees no file or a whole one, never one being written. A file a crash left
half-written anyway (no fsync: a power loss may keep the rename and lose the bytes) fails
its length or CRC check and is read again from the source, then replaced. Temporary files
of processes that are gone are removed when a store opens.

**Shared by the ranks of a node.** Ranks filling the same folder at once each write their
own temporary file; the last rename wins, both hold the same bytes, one file remains. A
rank that finds the entry already there does not write it again. Each store counts the
bytes it found when it opened plus those it wrote, so ranks filling at once may together
pass ``max_bytes`` by what the others wrote since (DESIGN departure noted in RESULTS).

Blocking: every method runs on the cache's threads (:mod:`aioloader.cache.samples`).
"""

from __future__ import annotations

import errno
import os
import threading
from contextlib import suppress
from pathlib import Path

from aioloader.cache.entries import HEADER, check, crc_ok, header, relpath
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena

__all__ = ["BAD", "DiskStore"]

#: :meth:`DiskStore.read` found an entry that failed its checks.
BAD = "bad"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's, alive
        return True
    return True


class DiskStore:
    """Entry files under ``folder``, at most ``max_bytes`` of them (see the module)."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        #: Bytes of entry files found at :meth:`open` plus those written since.
        self.held = 0
        #: Entries found at :meth:`open` plus those written since.
        self.entries = 0
        #: The disk said it is full (ENOSPC, EDQUOT): nothing more is written.
        self.full = False
        #: Keys whose entry :meth:`read` found bad: :meth:`put` replaces it, whatever its size.
        self._bad: set[str] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        """Make the folder, count what it holds, remove what dead writers left. Raises
        ``OSError`` naming the folder when it cannot be made or written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "cannot write the cache folder", str(self.folder))
        for sub in os.scandir(self.folder):
            if not sub.is_dir(follow_symlinks=False) or len(sub.name) != 2:
                continue
            try:
                entries = list(os.scandir(sub.path))
            except OSError:  # removed or unreadable meanwhile: nothing of it is counted
                continue
            for entry in entries:
                if entry.name.startswith(".tmp-"):
                    pid = entry.name.split("-")[1]
                    if pid.isdigit() and not _alive(int(pid)):
                        with suppress(OSError):
                            os.unlink(entry.path)
                    continue
                with suppress(OSError):
                    self.held += entry.stat(follow_symlinks=False).st_size
                    self.entries += 1

    def room(self, size: int = 1) -> bool:
        return not self.full and self.held + HEADER + size <= self.max_bytes

    def read(self, key: str, arena: Arena | None) -> Source | str | None:
        """The entry's bytes (into ``arena`` when it fits), None when there is none, or
        :data:`BAD` when there is one that fails its checks: its key is remembered, so the
        sample read again from the source replaces it (:meth:`put` otherwise keeps a file
        of the entry's size as another rank's). Not removed here: another rank may have
        replaced it with a good one meanwhile."""
        try:
            fd = os.open(self.folder / relpath(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER, 0)
            length = check(key, head, size)
            if length is None:
                return self._rejected(key)
            at = arena.alloc(length) if arena is not None and length else None
            if at is None:
                data = os.pread(fd, length, HEADER)
                return data if len(data) == length and crc_ok(head, data) else self._rejected(key)
            assert arena is not None
            view = arena.buf[at : at + length]
            if os.preadv(fd, [view], HEADER) != length or not crc_ok(head, view):
                arena.shrink(at, length, 0)
                return self._rejected(key)
            return (at, length)
        finally:
            os.close(fd)

    def _rejected(self, key: str) -> str:
        with self._lock:
            self._bad.add(key)
        return BAD

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Write the entry; False when it would pass the bound or the disk is full (nothing
        left behind). True also when another process wrote it already."""
        path = self.folder / relpath(key)
        size = HEADER + len(data)
        with self._lock:
            bad = key in self._bad
        try:
            old: int | None = os.stat(path).st_size
        except FileNotFoundError:
            old = None
        if old == size and not bad:
            return True  # written by another rank
        with self._lock:
            if not self.room(len(data)):
                return False
            self.held += size  # taken now: threads writing at once stay within the bound
        tmp = path.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{key}")
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, header(key, data))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp)
            with self._lock:
                self.held -= size
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    self.full = True
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return False
            raise
        with self._lock:
            self._bad.discard(key)
            if old is None:
                self.entries += 1
            else:
                self.held -= old  # the file replaced (a bad one): its bytes are gone
        return True

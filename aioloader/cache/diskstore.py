"""A disk cache's entries: one file per entry under the cache's folder
(:func:`~aioloader.cache.entries.relpath`), in the format of :mod:`aioloader.cache.entries`.

**Consistent after a SIGKILL at any moment.** An entry is written to a temporary name in
its sub-folder (``.tmp-<pid>-<thread>-<key>``, created exclusively and locked with
``flock`` while written), then renamed over its name: a reader sees no file or a whole one,
never one being written. A file a crash left half-written anyway (no fsync: a power loss may
keep the rename and lose the bytes) fails its length or CRC check and is read again from the
source, then replaced. A store that opens removes the temporary files no writer holds
locked any more, once their writer's pid is gone or they are a minute old (a writer in
another PID namespace holds its lock, whatever its pid means here).

**Shared by the ranks of a node.** Ranks filling the same folder at once each write their
own temporary file; the last rename wins, both hold the same bytes, one file remains. A
rank that finds the entry already there does not write it again. Each store counts the
bytes it found when it opened plus those it wrote, so ranks filling at once may together
pass ``max_bytes`` by what the others wrote since (a departure from DESIGN.md, noted in
RESULTS.md section 28).

A cache that fails loses entries, never samples: an entry that cannot be read is a miss.
Blocking: every method runs on the cache's threads (:mod:`aioloader.cache.samples`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from contextlib import suppress
from pathlib import Path

from aioloader.cache.entries import HEADER, check, crc_ok, header, relpath
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena

__all__ = ["BAD", "FULL", "DiskStore", "failed_write"]

#: :meth:`DiskStore.read` found an entry that failed its checks.
BAD = "bad"


#: The errnos by which a disk says it is full: no more writes are tried.
FULL = (errno.ENOSPC, errno.EDQUOT)

#: Seconds after which a temporary file no writer holds locked is left over, whatever its pid.
STALE = 60.0


def failed_write(exc: BaseException) -> tuple[str, str]:
    """The kind of a failed :meth:`DiskStore.put` (an ``OSError``'s errno name, else the
    exception's type) and what to say of it: the cause, the entry's file, what follows."""
    code = exc.errno if isinstance(exc, OSError) else None
    if not isinstance(exc, OSError) or code is None:
        return type(exc).__name__, f"{type(exc).__name__}: {exc}; the source is read instead"
    kind = errno.errorcode.get(code, f"errno {code}")
    after = "; no more entries are written (the disk is full)" if code in FULL else ""
    return kind, f"{kind}: {exc.strerror}, writing {exc.filename}; the source is read instead{after}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's, alive
        return True
    return True


def _left_over(path: str, name: str) -> bool:
    """Whether the temporary file ``path`` is what a writer that is gone left: unlocked,
    and of a pid that is gone or a minute old."""
    pid = name.split("-")[1]
    try:
        if not (pid.isdigit() and not _alive(int(pid))) and time.time() - os.stat(path).st_mtime < STALE:
            return False
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its writer is writing it
        return False
    finally:
        os.close(fd)
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
        #: The error by which the disk said it is full (ENOSPC, EDQUOT), else None: once set,
        #: nothing more is written (:meth:`put` raises it again for each write asked for).
        self.full: OSError | None = None
        #: Keys whose entry :meth:`read` found bad: :meth:`put` replaces it, whatever its size.
        self._bad: set[str] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        """Make the folder, count what it holds, remove what dead writers left. Raises
        ``OSError`` naming the folder when it cannot be made or written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "cannot write the cache folder", str(self.folder))
        with os.scandir(self.folder) as top:
            subs = [s.path for s in top if len(s.name) == 2 and s.is_dir(follow_symlinks=False)]
        for sub in subs:
            try:
                with os.scandir(sub) as found:
                    entries = list(found)
            except OSError:  # removed or unreadable meanwhile: nothing of it is counted
                continue
            for entry in entries:
                if entry.name.startswith(".tmp-"):
                    if _left_over(entry.path, entry.name):
                        with suppress(OSError):
                            os.unlink(entry.path)
                    continue
                with suppress(OSError):
                    self.held += entry.stat(follow_symlinks=False).st_size
                    self.entries += 1

    def room(self, size: int = 1) -> bool:
        return self.full is None and self.held + HEADER + size <= self.max_bytes

    def read(self, key: str, arena: Arena | None) -> Source | str | None:
        """The entry's bytes (into ``arena`` when it fits), None when there is none, or
        :data:`BAD` when there is one that fails its checks: its key is remembered, so the
        sample read again from the source replaces it (:meth:`put` otherwise keeps a file
        of the entry's size as another rank's). Not removed here: another rank may have
        replaced it with a good one meanwhile."""
        try:
            fd = os.open(self.folder / relpath(key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # none, or one that cannot be read (EACCES, EISDIR, EIO): a miss
            return None
        at: int | None = None
        length = 0
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER, 0)
            checked = check(key, head, size)
            if checked is None:
                return self._rejected(key)
            length = checked
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
        except OSError:  # EIO mid-read: a miss, its arena room given back
            if at is not None and arena is not None:
                arena.shrink(at, length, 0)
            return None
        finally:
            os.close(fd)

    def _rejected(self, key: str) -> str:
        with self._lock:
            self._bad.add(key)
        return BAD

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Write the entry; False when it would pass the bound (nothing left behind). True
        also when another process wrote it already. Raises the ``OSError`` of a write that
        failed (nothing left behind either), naming the entry's file and the cause (its
        errno kept); once the disk said it is full, that error again, without writing."""
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
            full = self.full
            fits = self.room(len(data))
            if fits:
                self.held += size  # taken now: threads writing at once stay within the bound
        if full is not None:
            raise OSError(full.errno, full.strerror, str(path))
        if not fits:
            return False
        tmp = path.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{key}")
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: not a left-over (open)
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
            failed = OSError(exc.errno, exc.strerror, str(path))  # the entry, not its .tmp name
            with self._lock:
                self.held -= size
                if exc.errno in FULL and self.full is None:
                    self.full = failed
            raise failed from exc
        with self._lock:
            self._bad.discard(key)
            if old is None:
                self.entries += 1
            else:
                self.held -= old  # the file replaced (a bad one): its bytes are gone
        return True

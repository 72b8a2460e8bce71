"""Shared-memory segments: the memory a batch slab lives in, and how another process
reaches it.

On Linux a segment is anonymous shared memory: ``memfd_create`` + ``ftruncate`` + ``mmap``.
It counts against the memory of the processes that use it, never against ``/dev/shm``
(Docker gives that 64 MB by default), and it is gone once its last holder is: there is no
name to leak, so nothing registers it anywhere. Its maker keeps the descriptor open while
the slab is in use (:meth:`Segment.close` closes it), and other processes of the same user
reach it by opening ``/proc/<maker pid>/fd/<fd>`` (a permission ptrace's read mode grants,
which yama's ``ptrace_scope`` does not restrict). ``/proc/<pid>/maps`` and the fd links name
it ``/memfd:aioloader-<pid>-<n>-<random>``.

Descriptor numbers are reused: once the maker closes a slab's fd, the next file it opens may
get the same number, and a task still queued for the old slab would then write into another
file. So a :class:`SegmentHandle` carries the segment's ``(st_dev, st_ino)``, and
:func:`attach` maps what it opened only when the file is that one; every cache of mappings
is keyed by the segment's unique name, never by its path.

Where memfd is impossible (no ``os.memfd_create``, not Linux, ``/proc`` not mounted), a
segment is a file in ``/dev/shm``, as before: its pages are reserved when it is made (a
tmpfs too small fails then, with a clear error, rather than with a SIGBUS later), it is
registered with multiprocessing's resource tracker while its name exists and before it has
pages (so a killed trainer leaves no memory behind), and ``aioloader doctor`` finds those of
dead processes.

``AIOLOADER_SLABS`` chooses, read each time a slab pool is made (:func:`choose_kind`):
``auto`` (the default: memfd where possible, else ``/dev/shm``), ``memfd`` (memfd or no
slabs: every sample is pickled), ``devshm`` (always ``/dev/shm``, e.g. to test the fallback).
A loader process (the default, :mod:`aioloader.run.loaderproc`) reads the trainer's environment as it
was when that loader started, not when the process's first loader did: each loader's helpers
follow the environment of their own start (:mod:`aioloader.procs.forking`).
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import sys
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

from aioloader.errors import LoaderError

__all__ = [
    "ENV",
    "FDS_PER_SLAB",
    "SHM_DIR",
    "Segment",
    "SegmentGone",
    "SegmentHandle",
    "attach",
    "choose_kind",
]

#: The fallback's folder: a tmpfs, so "files" there are shared memory.
SHM_DIR = "/dev/shm"
#: The environment variable that chooses where segments live (see the module docstring).
ENV = "AIOLOADER_SLABS"
MEMFD, DEVSHM = "memfd", "devshm"
#: Descriptors a memfd slab holds in its maker: its own, and before Python 3.13 the
#: duplicate every ``mmap`` object keeps for as long as it lives.
FDS_PER_SLAB = 1 if sys.version_info >= (3, 13) else 2


@dataclass(frozen=True, slots=True)
class SegmentHandle:
    """How another process reaches a segment: ``name`` (``aioloader-<pid>-<n>-<random>``,
    unique: the key of every cache of mappings), ``path`` to open (``/proc/<pid>/fd/<fd>``,
    or ``/dev/shm/<name>`` for the fallback), and the ``dev``/``ino`` the file opened there
    must have."""

    name: str
    path: str
    dev: int
    ino: int

    def __reduce__(self) -> tuple[Any, ...]:  # in every task: see protocol.Chunk
        return (SegmentHandle, (self.name, self.path, self.dev, self.ino))


class SegmentGone(OSError):
    """The segment a handle names is no longer reachable (its maker closed it, or ended)."""


def memfd_possible() -> bool:
    """Whether this process can make a memfd that others reach through ``/proc``."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        fd = os.memfd_create("aioloader-probe", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        # What other processes will open: /proc must be mounted, and be this pid namespace's.
        probe = os.open(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDWR)
    except OSError:
        os.close(fd)
        return False
    try:
        return os.path.sameopenfile(fd, probe)
    finally:
        os.close(probe)
        os.close(fd)


def devshm_possible() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def choose_kind() -> str | None:
    """Where this process's slabs go, as ``AIOLOADER_SLABS`` says now (another value is a
    :class:`LoaderError`): ``"memfd"``, ``"devshm"``, or None where neither can be made.
    What None means is the caller's: the pipeline then makes no slabs (every sample crosses
    the workers' pipes pickled) and the loader process spills nothing, while a
    :class:`~aioloader.memory.slabs.SlabPool` left to choose raises :class:`LoaderError`."""
    wanted = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", MEMFD, DEVSHM):
        raise LoaderError(f"{ENV}={wanted!r}: expected 'auto', 'memfd' or 'devshm'")
    if wanted != DEVSHM and memfd_possible():
        return MEMFD
    if wanted != MEMFD and devshm_possible():
        return DEVSHM
    return None


class Segment:
    """A segment of ``size`` bytes made by this process, named ``name``, of ``kind``:
    ``mmap`` maps it here and ``handle`` lets other processes map it."""

    def __init__(self, name: str, size: int, kind: str) -> None:
        self.kind = kind
        self.size = max(size, 1)
        self.closed = False
        self._fd = -1
        if kind == MEMFD:
            self.mmap, self.handle = self._make_memfd(name)
        else:
            self.mmap, self.handle = self._make_devshm(name)

    def _make_memfd(self, name: str) -> tuple[mmap.mmap, SegmentHandle]:
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError as exc:
            raise _no_memory(self.size, "as anonymous shared memory (memfd)", exc) from exc
        try:
            # No posix_fallocate: no tmpfs limit to run into, and it would zero every page
            # now; pages are allocated as the workers first write them.
            os.ftruncate(fd, self.size)
            m = _map(fd, self.size)
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise _no_memory(self.size, "as anonymous shared memory (memfd)", exc) from exc
        self._fd = fd
        return m, SegmentHandle(name, f"/proc/{os.getpid()}/fd/{fd}", st.st_dev, st.st_ino)

    def _make_devshm(self, name: str) -> tuple[mmap.mmap, SegmentHandle]:
        path = os.path.join(SHM_DIR, name)
        # Made, registered, then given its pages: the tracker never holds a name /dev/shm lacks
        # (a maker killed between would leave it one the trainer cannot find, and a warning at
        # exit), and a whole tree killed between the first two steps leaves an empty name,
        # no memory, that carries the maker's pid for ``aioloader doctor``.
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            _track(name)
            # Reserve the pages now: a tmpfs that is too small then fails here with ENOSPC,
            # instead of a SIGBUS in whichever process first touches a missing page.
            os.posix_fallocate(fd, 0, self.size)
            st = os.fstat(fd)
            return _map(fd, self.size), SegmentHandle(name, path, st.st_dev, st.st_ino)
        except OSError as exc:
            _untrack(name)
            os.unlink(path)
            free = shutil.disk_usage(SHM_DIR).free
            raise LoaderError(
                f"cannot allocate a {self.size / 2**20:.1f} MiB shared-memory batch slab in {SHM_DIR} "
                f"({free / 2**20:.1f} MiB free there): {exc.strerror or exc}. Enlarge {SHM_DIR} "
                "(e.g. docker run --shm-size=8g) or lower batch_size or prefetch."
            ) from exc
        finally:
            os.close(fd)

    def close(self) -> None:
        """Make it unreachable for other processes (close the memfd's descriptor, unlink the
        ``/dev/shm`` name); the mapping here lives on while anything views it."""
        if self.closed:
            return
        self.closed = True
        if self.kind == MEMFD:
            os.close(self._fd)
            self._fd = -1
            return
        # Untracked, then unlinked: a kill between the two leaves a name in /dev/shm, which
        # the trainer (or ``aioloader doctor``) finds by its pid and removes; the other way
        # round would leave the tracker a name it can no longer find, and a warning at exit.
        _untrack(self.handle.name)
        try:
            os.unlink(self.handle.path)
        except FileNotFoundError:
            pass


def _no_memory(size: int, how: str, exc: OSError) -> LoaderError:
    # Each memfd slab holds a descriptor while it lives (batches the trainer keeps included).
    hint = "lower batch_size or prefetch"
    if exc.errno == errno.EMFILE:
        hint = "raise the open-file limit (ulimit -n), or keep fewer batches"
    return LoaderError(
        f"cannot allocate a {size / 2**20:.1f} MiB shared-memory batch slab {how}: "
        f"{exc.strerror or exc}; {hint}"
    )


def attach(handle: SegmentHandle) -> mmap.mmap:
    """Map the segment ``handle`` names, in this process. Raises :class:`SegmentGone` when
    its path is gone or is another file now (the maker closed that fd and reused the
    number), and OSError for anything else that fails; maps nothing then."""
    try:
        fd = os.open(handle.path, os.O_RDWR)
    except FileNotFoundError as exc:
        raise SegmentGone(errno.ENOENT, f"shared-memory slab {handle.name} is gone ({handle.path})") from exc
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (handle.dev, handle.ino):
            raise SegmentGone(
                errno.ESTALE, f"shared-memory slab {handle.name} is gone ({handle.path} is another file now)"
            )
        return _map(fd, 0)
    finally:
        os.close(fd)


def _map(fd: int, size: int) -> mmap.mmap:
    """``fd`` mapped shared, read-write (``size`` 0: all of it), holding no descriptor where
    Python allows (3.13's ``trackfd``)."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, trackfd=False)
    return mmap.mmap(fd, size)


def _track(name: str) -> None:
    resource_tracker.register("/" + name, "shared_memory")  # POSIX shm names: /dev/shm/<name>


def _untrack(name: str) -> None:
    resource_tracker.unregister("/" + name, "shared_memory")

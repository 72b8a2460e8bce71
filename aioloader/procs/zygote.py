"""The zygote: the one fork server every loader of the process gets its helpers from.

Decode workers must not be plain ``fork`` children of the trainer once other threads exist
(a lock held by one of them would be copied, held forever, into the child). The stock
``forkserver`` avoids that by exec'ing a fresh interpreter that then forks the workers, but
that interpreter must import what the workers need: with a training script that imports
torch, the first batch waits a second or more for it.

The zygote is started when the first loader of the process is made: ``Loader.__init__``
calls :func:`early` (see there why not when it starts). A loader whose ``__init__`` does not
(``decode_on="ray"``, or ``decode=None`` with ``loader_process=False``) asks for it when a
part of it that forks helpers starts. Either way only if no ``aioloader-*`` thread exists
yet, and in one of two ways (:func:`started_by`), chosen by a rule about the process's
threads, every library's, not only aioloader's (:mod:`aioloader.procs.forksafe`):

- ``"fork"``, where every other thread is of a kind safe to fork past (none; OpenBLAS's,
  stopped for the fork; an idle OpenMP pool, PyTorch's intra-op threads after a model's
  forward pass; the CUDA driver's): the usual case, as fast as DataLoader's fork. The child
  already holds every module the trainer imported (the decode function's included, and
  what the helpers need that the trainer lacked, imported by the trainer just before), sets
  one OpenMP and torch thread first thing (:func:`~aioloader.procs.forksafe.after_fork`),
  closes its copies of the trainer's pipes and sockets, and never collects objects copied
  from the trainer.
- ``"spawn"``, otherwise (another Python thread runs: a Jupyter kernel's, a launcher's; or a
  native thread of an unknown kind): a fresh interpreter, exec'd like the stock fork
  server's, which imports what the loader process and the workers need before serving
  (:mod:`aioloader.procs.cleanstart`). Nothing of the trainer's is copied into it, so a lock
  held at that moment by one of the trainer's threads cannot reach a helper; its first
  helpers wait for its imports once, never each for its own.

Either way it names itself ``aioloader-fork``, runs multiprocessing's own fork-server loop,
forks helpers in milliseconds, and is shared by every loader of the process. It exits when
the trainer's process does, however it ends: its "alive" pipe, whose write end only the
trainer holds, reaches end of file, and on Linux the kernel kills it too when it was started
from the trainer's main thread (the parent-death signal follows the starting thread; see
:mod:`aioloader.safety.lifeline`). A clean exit ends it earlier, before the interpreter's
teardown, once no helper of its lives (:func:`_stop_at_exit` says why). Each helper takes
the trainer's environment, working directory and ``sys.path`` of the moment its loader
starts (:mod:`aioloader.procs.forking`).

Where it cannot be made (not POSIX, a Python whose fork-server internals differ, a loader
thread already running), :func:`context` returns None and workers come from the stock
``forkserver``.

What it is asked and answers is multiprocessing's fork-server protocol (the helper's
descriptors, then its preparation data and process object pickled, written by
:func:`~aioloader.procs.forking.launch`; the new pid back), served by the standard library's
own loop: none of it is defined here. What aioloader adds is one record, :class:`Address`:
how a loader process reaches its trainer's zygote (:func:`address`, then :func:`adopt`).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import (
    connection,
    forkserver,
    popen_forkserver,
    reduction,
    resource_tracker,
    util,
)
from multiprocessing import context as mpcontext
from typing import Any

from aioloader.procs import cleanstart, forking, forksafe, roles

__all__ = ["Address", "address", "adopt", "context", "early", "pid", "started_by"]

_lock = threading.Lock()
_server: _Zygote | None = None
_context: ZygoteContext | None = None


class _Zygote(forkserver.ForkServer):
    """A ``ForkServer`` whose server process is forked from this one (see the module)."""

    #: How this zygote was started (:func:`started_by`); None for one adopted.
    started_by: forksafe.Start | None = None
    #: What a clean start imports beside the helpers' modules (:func:`context`).
    preload: list[str] = []  # noqa: RUF012 - replaced per instance, never changed in place

    def start(self) -> None:
        # Counted before anything here forks (the resource tracker's start may stop
        # OpenBLAS's threads): see forksafe.census.
        threads = forksafe.census()
        how = forksafe.how_to_start(threads)
        if how == "fork":
            # What the helpers import that the trainer has not (numpy's random generators,
            # Pillow's format plugins: about 15 ms), imported before the fork, so that the
            # zygote and every helper share one copy rather than each importing its own.
            cleanstart.import_all(cleanstart.preloads())
        resource_tracker.ensure_running()  # before the zygote: workers share this one
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # Only this process holds the write end of the "alive" pipe: when it exits,
            # however, the read end reaches end of file and the zygote's loop returns.
            alive_r, alive_w = os.pipe()
            # The kernel's parent-death signal fires when the starting *thread* ends: ask for
            # it only when that is the main thread, which lives as long as the process.
            parent = os.getpid() if threading.current_thread() is threading.main_thread() else None
            try:
                if how == "fork":
                    child = forksafe.fork()
                    if child == 0:  # pragma: no cover - runs in the zygote (tests see its effects)
                        _become_zygote(listener.fileno(), alive_r, parent, threads)
                else:
                    child = cleanstart.spawn_zygote(listener.fileno(), alive_r, parent, self.preload)
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
            # The stock fork server hands its client's "alive" fd to every child it forks,
            # so that it outlives them. Ours must not: a worker holding it would keep the
            # zygote (and so itself) alive after the trainer died. Workers get the write
            # end of a pipe nobody reads instead.
            unread_r, unread_w = os.pipe()
            os.close(unread_r)
        self._forkserver_address = address
        self._forkserver_alive_fd = unread_w
        self._alive_w = alive_w
        self._forkserver_pid = child
        self.started_by = how

    def ensure_running(self) -> None:
        """The zygote runs from :meth:`start` on; it is never restarted here (a fork now
        could copy a held lock): a dead zygote fails the next worker start, loudly."""


def _become_zygote(listener_fd: int, alive_r: int, parent: int | None, threads: forksafe.Census) -> None:
    """The forked zygote: leave the trainer's state behind, then serve (never returns)."""
    global _lock
    try:
        # The trainer forked this process inside ``with _lock``: this copy of it would stay
        # held for ever, in the zygote and in everything it forks.
        _lock = threading.Lock()
        forksafe.after_fork(threads)  # before anything here can start a parallel region
        cleanstart.begin(parent)
        # Objects of the trainer that were garbage at the fork stay uncollected: their
        # finalizers must not close file descriptors or files that are not ours.
        gc.freeze()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)  # the trainer's handlers are not ours
        # faulthandler writes a crashing worker's traceback to the fd it was given, which
        # may be one of those closed below and then reused (by a slab's mapping, say).
        if faulthandler.is_enabled():
            faulthandler.enable(file=sys.__stderr__ or 2, all_threads=True)
        # Pipes and sockets of the trainer are closed: a copy held here would keep their
        # other end from ever seeing end-of-file. Other files stay open, as after any fork:
        # objects copied from the trainer (a log handler, say) may still write to them, and
        # a closed number could be reused by a file of ours.
        keep = {0, 1, 2, listener_fd, alive_r}
        for fd in _open_fds():
            if fd not in keep and _is_pipe_or_socket(fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
    except BaseException:  # noqa: BLE001 - whatever happens, never return into the trainer's code
        os._exit(1)
    cleanstart.serve(listener_fd, alive_r)


def _is_pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _open_fds() -> list[int]:
    try:
        return sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    except OSError:
        return list(range(3, 1024))


class _ZygotePopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` asking the zygote, not the stock fork server, and never
    for the main module (:mod:`aioloader.procs.forking`)."""

    def _launch(self, process_obj: Any) -> None:
        assert _server is not None
        forking.launch(self, process_obj, _server)


class _ZygoteProcess(forking.HelperProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _ZygotePopen(process_obj)


class ZygoteContext(mpcontext.ForkServerContext):
    """A multiprocessing context whose processes are forked by the zygote."""

    Process = _ZygoteProcess


def _supported() -> bool:
    # The fork-server protocol this module speaks is CPython 3.10-3.13's (3.14 adds an
    # authentication step), on POSIX with fd passing.
    return (
        (3, 10) <= sys.version_info[:2] < (3, 14)
        and hasattr(os, "fork")
        and getattr(reduction, "HAVE_SEND_HANDLE", False)
        and sys.platform != "win32"
    )


def _loader_threads() -> list[str]:
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me and t.name.startswith("aioloader-")]


def context(preload: Sequence[str] = ()) -> ZygoteContext | None:
    """The zygote's context, starting the zygote now if this is the first call and no loader
    thread runs (forked or in a fresh interpreter, which also imports ``preload``, see the
    module docstring); None: use the stock fork server."""
    global _server, _context
    with _lock:
        if _context is not None:
            return _context
        if _server is not None or not _supported() or _loader_threads():
            return None
        server = _server = _Zygote()
        server.preload = list(preload)
        try:
            server.start()
        except OSError:
            return None
        _context = ZygoteContext()
        atexit.register(_stop_at_exit)
        return _context


def _stop_at_exit(wait: float = 1.0) -> None:
    """End the zygote as the trainer's interpreter exits, once no helper of its lives (the
    loaders' own exit hook, on ``threading``'s, ran before this one).

    Forked, the zygote shares the trainer's pages of that moment; the trainer's teardown then
    writes to nearly all of them (each object freed), and each page it writes while the zygote
    still maps it is copied: for a moment the tree holds the trainer's import-time memory
    twice (RESULTS §37). Ended first, the zygote gives those pages to the trainer alone."""
    global _context
    server = _server
    if server is None or server.started_by is None:
        return
    pid = server._forkserver_pid
    if _has_children(pid):
        return
    with _lock:
        _context = None  # a loader made from here on takes the stock fork server
    try:
        os.close(server._alive_w)
    except OSError:
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.002)


def _has_children(pid: int) -> bool:
    """Whether a process's parent is ``pid`` (Linux ``/proc``; True where it cannot tell)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        return True
            except (OSError, ValueError, IndexError):
                continue
    return False


def started_by() -> forksafe.Start | None:
    """How this process's zygote was started: ``"fork"`` (a copy of this process) or
    ``"spawn"`` (a fresh interpreter), see the module; None where it started none (no zygote
    yet, none possible, or one adopted from the process that started it)."""
    return _server.started_by if _server is not None else None


def early(*callables: object) -> None:
    """Make the zygote now, as a loader is made (a no-op inside a helper, or once made): not
    when it starts, since a trainer usually makes its model (its CUDA context, its intra-op
    threads) in between, and the zygote is then still forked (milliseconds) rather than
    started clean (a second or more; started clean, it boots meanwhile). Before the loader's
    arguments are checked, too: resolving ``device="cuda"`` makes the CUDA context.
    ``callables``: the loader's decode, read and collate, whose modules a zygote started clean
    imports (:func:`~aioloader.procs.cleanstart.modules_of`)."""
    if roles.role() is None:
        context(cleanstart.modules_of(*callables))


def pid() -> int | None:
    """The zygote's pid, if it was started."""
    return _server._forkserver_pid if _server is not None else None


@dataclass(frozen=True, slots=True)
class Address:
    """Where a zygote listens: its Unix ``socket`` address (a path, or an abstract name) and
    its ``pid``; sent to the loader process with its start."""

    socket: Any
    pid: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (Address, (self.socket, self.pid))


def address() -> Address | None:
    """Where this process's zygote listens, for :func:`adopt` in a process it forks (the
    loader process); None when there is none."""
    with _lock:
        if _context is None or _server is None:
            return None
        return Address(_server._forkserver_address, _server._forkserver_pid)


def adopt(where: Address) -> None:
    """In a process the zygote forked (the loader process): ask that zygote, at ``where``
    (from :func:`address`), for this process's decode workers too. Their lifeline is this
    process (multiprocessing's parent sentinel); like the trainer's workers, they get the
    write end of a pipe nobody reads as the fork server's "alive" fd."""
    global _server, _context
    server = _Zygote()
    unread_r, unread_w = os.pipe()
    os.close(unread_r)
    server._forkserver_address, server._forkserver_pid = where.socket, where.pid
    server._forkserver_alive_fd = unread_w
    with _lock:
        _server, _context = server, ZygoteContext()

"""What runs in a reader process (:mod:`aioloader.read.workers`): groups of paths in, each
file read into one part of the process's shared buffer, where each one is sent back.

The process holds its buffer and its pipe, nothing else: it reads what it is sent, in the
order sent, answers and takes the next group, until the pipe closes (the loader closed) or its
parent is gone (:mod:`aioloader.safety.lifeline`). The buffer has :data:`PARTS` parts, so the
loader sends the next group while this one is read, into another part: the process does not
wait a round trip between groups. What it is sent and answers is :mod:`aioloader.read.readmsgs`.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from aioloader.memory.segments import SegmentHandle, attach
from aioloader.procs import roles
from aioloader.read.blocking import HINT_MAX, MOUNTS, ReadPace, named, own_time, read_file, run_queue_seconds
from aioloader.read.readmsgs import GroupRead, parse_group
from aioloader.read.urls import local_path
from aioloader.safety import lifeline

__all__ = ["PARTS", "main", "read_into"]

#: Groups a process may be sent before it answers the first: one read, one waiting in the
#: pipe. Each has a part of the buffer, until the loop has copied its files out.
PARTS = 2


def main(conn: Connection, handle: SegmentHandle) -> None:
    """A reader process's life (the ``target`` it is started with): read each
    :class:`~aioloader.read.readmsgs.Group` it is sent into that part of the buffer
    ``handle`` names (offsets in the answer are the part's), answer, until the pipe
    closes."""
    roles.become("reader")
    lifeline.follow_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer owns shutdown
    try:
        buf = memoryview(attach(handle))
    except OSError:  # closed before this process came up
        return
    size = len(buf) // PARTS
    parts = [buf[i * size : (i + 1) * size] for i in range(PARTS)]
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        group = parse_group(data)
        answer = read_into(parts[group.part], group.paths, ReadPace())
        try:
            conn.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the loader closed while this group was read: nobody waits for it
            return


def read_into(buf: memoryview, paths: list[str], pace: ReadPace) -> GroupRead:
    """``paths`` read one after another into ``buf`` (a group's rules: see
    :func:`~aioloader.read.blocking.read_group`), each as ``(offset, length)`` there, its
    bytes when it does not fit, or its ``OSError``.

    The worker's whole job, so the common case is written out: once a file's size is known,
    the next ones are read with it as the hint (:func:`~aioloader.read.blocking.read_file`),
    straight into the buffer, with no fstat and no allocation. A file that is larger, the
    first of a group, or on a filesystem that may answer reads short, is read whole by
    ``read_file`` and copied in.
    """
    out: list[Any] = []
    times: list[float] = []
    pos, end, hint = 0, len(buf), 0
    folder, whole = None, False
    queued = run_queue_seconds()  # a slow-looking read's wait for a CPU is not the storage's
    start = t = time.perf_counter()
    for path in paths:
        try:
            local = local_path(path)
            cut = local.rfind(os.sep) + 1
            if local[:cut] != folder:
                folder = local[:cut]
                whole = MOUNTS.whole_reads(folder)
            want = hint + 1
            n = want
            if whole and hint and pos + want <= end:
                fd = os.open(local, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    n = os.readv(fd, [buf[pos : pos + want]])
                finally:
                    os.close(fd)
            if n < want:  # the whole file, in place
                out.append((pos, n))
                pos += n
            else:  # no hint, or larger than it: read whole, then in place if it fits
                data = read_file(path)
                n = len(data)
                hint = max(hint, n) if n <= HINT_MAX else hint
                if pos + n <= end:
                    buf[pos : pos + n] = data
                    out.append((pos, n))
                    pos += n
                else:
                    out.append(data)
        except OSError as exc:
            out.append(named(exc, path).with_traceback(None))
        now = time.perf_counter()
        took = now - t
        if took > pace.slow:
            took, queued = own_time(took, queued)
        times.append(took)
        if took > pace.slow:
            return GroupRead(out, True, times)
        if now - start > pace.budget:
            break
        t = now
    return GroupRead(out, False, times)

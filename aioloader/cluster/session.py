"""One loader's Ray tasks: connected at start, every task in flight known, all cancelled by
:meth:`RaySession.close` (the Ray connection itself stays open: it is the user's).

The remote function asks one CPU per task and no retries from Ray (``max_retries=0``):
which failures are tried again, and how, is the loader's decision
(:mod:`aioloader.cluster.faults`), so a poison sample is not retried blindly and a node's
death costs a chunk one try, not Ray's three.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from aioloader.cluster import connect
from aioloader.cluster.task import Reading, decode_task

__all__ = ["RaySession"]


class RaySession:
    """The connection, the remote function and the tasks of one loader.

    ``tasks``: tasks decoding at once (None: the cluster's CPUs when :meth:`start` runs);
    at most twice that are in flight (one running and one queued each), as locally.
    """

    def __init__(self, decode_blob: bytes, tasks: int | None) -> None:
        self._blob = decode_blob
        self._asked = tasks
        self.tasks = tasks or 1
        self.token = uuid.uuid4().hex
        self._ray: Any = None
        self._remote: Any = None
        self._box: list[Any] = []
        self._live: set[Any] = set()
        self._lock = threading.Lock()
        self.closed = False

    @property
    def bound(self) -> int:
        """Tasks in flight at most."""
        return 2 * self.tasks

    def start(self) -> None:
        """Connect (see :func:`~aioloader.cluster.connect.connect`), size the tasks to the
        cluster, and put the decode function in the object store once."""
        ray = self._ray = connect.connect()
        self.tasks = self._asked if self._asked is not None else connect.cluster_cpus(ray)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(decode_task)
        self._box = [ray.put(self._blob)]

    def submit(
        self,
        items: list[tuple[int, int, bytes | str]],
        seed: int,
        epoch: int,
        timeout: float | None,
        reading: Reading | None,
    ) -> Any:
        """Start the task of one chunk; its ``ObjectRef`` (pass it to :meth:`done`)."""
        ref = self._remote.remote(self._box, self.token, items, seed, epoch, timeout, reading)
        with self._lock:
            self._live.add(ref)
        return ref

    def done(self, ref: Any) -> None:
        """``ref``'s answer was taken, or given up on."""
        with self._lock:
            self._live.discard(ref)

    def cancel(self, ref: Any, force: bool) -> None:
        """Cancel one task; ``force`` kills its worker process (a decode stuck in C code)."""
        try:
            self._ray.cancel(ref, force=force)
        except Exception:  # noqa: BLE001 - it may have ended, or its node gone: nothing to stop
            pass

    def close(self) -> None:
        """Cancel every task still in flight; drop the decode function's object. Idempotent."""
        with self._lock:
            live, self._live = list(self._live), set()
            self.closed = True
        for ref in live:
            self.cancel(ref, force=False)
        self._box = []

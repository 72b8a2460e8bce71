"""One loader's Ray tasks: connected at start, every task in flight known, none left running
once :meth:`RaySession.close` returns (the Ray connection itself stays open: it is the user's).

A task the loader no longer waits for (an epoch left mid-way, a batch that failed, close)
is left to end by itself, not cancelled with Ray's plain ``ray.cancel``: that raises
``KeyboardInterrupt`` only between two bytecodes (a decode inside one blocking call, a
sleep, a read, C code, runs on regardless), and a cancel that meets the task's own answer
crashes the whole process (Ray's ``Check failed: it != submissible_tasks_.end()``, the race
of ray-project/ray#54798). Close waits :data:`CLOSE_GRACE` for what is in flight to end,
and cancels what still runs then with ``force=True`` (its worker is killed): a closed
loader leaves no task on the cluster, and only a task that ends at that very moment could
still meet Ray's race.

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

__all__ = ["CLOSE_GRACE", "RaySession"]

#: Seconds close() gives the tasks in flight to end before it kills those still running.
CLOSE_GRACE = 1.0


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
        self._abandoned: set[Any] = set()
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

    def abandon(self, ref: Any) -> None:
        """The loader stopped waiting for ``ref`` (an epoch left mid-way, a batch that failed,
        closing): left to end by itself (see the module docstring), and remembered until it
        has, for :meth:`close` to kill if it runs on."""
        with self._lock:
            self._abandoned.add(ref)
            pending = list(self._abandoned)
        try:  # forget those that have ended (timeout=0: this does not wait)
            ended, _ = self._ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        except Exception:  # noqa: BLE001 - close() sees to them
            return
        with self._lock:
            self._abandoned.difference_update(ended)

    def cancel(self, ref: Any, force: bool) -> None:
        """Cancel one task; ``force`` kills its worker process (a decode stuck in C code)."""
        try:
            self._ray.cancel(ref, force=force)
        except Exception:  # noqa: BLE001 - it may have ended, or its node gone: nothing to stop
            pass

    def close(self) -> None:
        """Wait up to :data:`CLOSE_GRACE` for the tasks in flight to end, kill those still
        running (see the module docstring); drop the decode function's object. Idempotent."""
        with self._lock:
            tasks = list(self._live | self._abandoned)
            self._live, self._abandoned = set(), set()
            self.closed = True
        if tasks:
            try:
                _, running = self._ray.wait(
                    tasks, num_returns=len(tasks), timeout=CLOSE_GRACE, fetch_local=False
                )
            except Exception:  # noqa: BLE001 - Ray shut down meanwhile: nothing runs any more
                running = []
            for ref in running:
                self.cancel(ref, force=True)
        self._box = []

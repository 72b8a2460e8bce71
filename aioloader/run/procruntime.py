"""The trainer's side of a loader that runs in a loader process (``loader_process="auto"``,
the default, or True, where a zygote can be made).

:class:`ProcessRuntime` has the interface of :class:`~aioloader.run.runtime.Runtime`
(``start_run``, ``copier``, ``check_owner``, ``shutdown``), but the trainer's process holds
only the ``aioloader-transfer`` bridging thread: it reads the loader process's messages
(:class:`PipeRun`), maps the batches' slabs (:mod:`aioloader.run.wire`), copies them to the device and
hands them to the trainer. Everything else runs in the loader process
(:mod:`aioloader.run.loaderproc`, which draws the two channels between them; their messages are
:mod:`aioloader.run.messages`).

Shutdown, idempotent and bounded like the in-process one: cancel the run, stop the bridge,
ask the loader process to close (it stops its workers and closes its slabs), wait up to a
few ``grace`` periods, then kill it. Batches the trainer still holds stay valid: their
mappings outlive the loader process's descriptors and names.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from multiprocessing import connection, resource_tracker
from multiprocessing.connection import Connection
from typing import Any

import torch

from aioloader.base import heap
from aioloader.base.items import END, Batch, Failure, Item
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.errors import LoaderError
from aioloader.observe.stats import Counters
from aioloader.plan.resume import ResumePoint
from aioloader.procs import roles, zygote
from aioloader.run import loaderproc, messages, runtime, wire
from aioloader.run.bridge import Bridge, device_decode_for
from aioloader.run.device import DeviceCopier
from aioloader.run.handoff import Handoff
from aioloader.run.pipeline import slabs_for
from aioloader.safety import doctor, gcfreeze

__all__ = ["NoZygote", "PipeRun", "ProcessRuntime"]

START_TIMEOUT = 120.0  # seconds for the loader process to build its pipeline


class NoZygote(Exception):
    """No zygote can be made here: the loader runs in the trainer's process instead."""


#: A message at least this large carried a batch's samples pickled (a zero-copy batch's
#: message is a few hundred bytes per leaf).
_LARGE = 1 << 20


class _Channel:
    """The trainer's ends of the two channels (see :mod:`aioloader.run.loaderproc`)."""

    def __init__(self, conn: Connection, back_w: int, counters: Counters, maps: int) -> None:
        self.conn = conn
        self.counters = counters
        self.maps = wire.SlabMaps(maps)
        self.eof = False
        self._back_w = back_w
        self._control = threading.Lock()
        # Re-entrant: a finalizer writing a line may run inside another write of this thread
        # (garbage collection happens at any allocation); each line is one atomic os.write.
        self._back = threading.RLock()
        self._back_open = True
        self._wait_sent = -1  # batches delivered as the last Waited line said (bridge thread only)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # Batches that crossed pickled (before the layout is learned) leave megabytes in the
        # bridge thread's malloc arena: given back once zero-copy batches follow them.
        self._trim = heap.BurstTrim()

    def control(self, msg: messages.Control) -> None:
        """Send ``msg`` to the loader process (any thread); lost if it is gone."""
        data = pickle.dumps(msg, protocol=5)
        with self._control:
            try:
                self.conn.send_bytes(data)
            except OSError:
                pass

    def back(self, lines: bytes) -> None:
        """Lines on the back pipe (:func:`~aioloader.run.messages.back_lines`), in one write
        (any thread, finalizers included); lost once closed."""
        with self._back:
            if self._back_open:
                try:
                    os.write(self._back_w, lines)
                except OSError:  # the loader process is gone
                    pass

    def taken(self, run_id: int) -> None:
        """The bridge took an item of ``run_id`` (bridge thread only): one more may be sent,
        and, when it grew, the trainer's wait for batches goes along
        (:class:`~aioloader.run.messages.Waited`), in the same write."""
        waited, batches = self.counters.trainer_wait.totals()
        if batches != self._wait_sent:
            self._wait_sent = batches
            self.back(messages.back_lines(messages.Taken(run_id), messages.Waited(waited, batches)))
        else:
            self.back(messages.back_lines(messages.Taken(run_id)))

    def wake(self) -> None:
        """Make a :meth:`recv` waiting now (or next) return None."""
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass

    def recv(self) -> messages.Report | None:
        """The next message for a run (bridge thread only); log records are emitted here.
        None when woken by :meth:`wake`, or at end of file (``eof`` is then True)."""
        while True:
            if self.eof:
                return None
            ready = connection.wait([self.conn, self._wake_r])
            if self._wake_r in ready:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                return None
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                self.eof = True
                return None
            msg: messages.Report = pickle.loads(data)
            if self._trim.saw(len(data) >= _LARGE):
                del data
                heap.trim()
            if isinstance(msg, messages.LogMsg):
                logging.getLogger(msg.record.name).handle(msg.record)
                continue
            return msg

    def to_item(self, msg: messages.RunMsg) -> Item:
        self.counters.absorb(msg.counts)
        if isinstance(msg, messages.EndMsg):
            return END
        if isinstance(msg, messages.FailMsg):
            return Failure(wire.unpack_error(msg.error))
        # Made now: a finalizer writes its slab's line without building it.
        tags = [messages.back_lines(messages.Released(h.name)) for h in msg.handles]
        try:
            buffers = [self.maps.get(h) for h in msg.handles]
        except OSError as exc:  # its slab is gone (the loader process is closing) or cannot be mapped
            for tag in tags:
                self.back(tag)
            return Failure(LoaderError(f"batch {msg.index}: its shared memory is gone: {exc}"))
        value = wire.decode(msg.treedef, msg.leaves, buffers, lambda i: self.back(tags[i]))
        return Batch(index=msg.index, value=value, size=msg.size, done=msg.done)

    def discard(self, msg: messages.Report) -> None:
        """A message of a run nobody serves any more: a batch's slabs go back at once."""
        if isinstance(msg, messages.BatchMsg):
            for h in msg.handles:
                self.back(messages.back_lines(messages.Released(h.name)))

    def close(self) -> None:
        with self._back:
            self._back_open = False
            os.close(self._back_w)
        self.conn.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.maps.close()


class PipeRun:
    """One pass over an epoch, served from the loader process (the bridge's run)."""

    def __init__(self, channel: _Channel, run_id: int, proc: Any) -> None:
        self.id = run_id
        self.handoff: Handoff[Item] = Handoff(1)
        self.cancelled = False
        self._channel = channel
        self._proc = proc  # the loader process
        self._lock = threading.Lock()

    def next_ready(self) -> Item | None:
        """Next item of this run (bridging thread only); None once cancelled."""
        ch = self._channel
        while not self.cancelled:
            msg = ch.recv()
            if msg is None:
                if ch.eof and not self.cancelled:
                    return self._exited()
                continue
            if not isinstance(msg, messages.RunMsg) or msg.run_id != self.id:
                ch.discard(msg)
                continue
            batch = isinstance(msg, messages.BatchMsg)
            if batch:
                ch.taken(self.id)  # the loader process may send one more
            item = ch.to_item(msg)
            # A batch sent just before the loader process was killed: its slabs went with it.
            # That the process died is the error to report, not the slab it took along.
            if batch and isinstance(item, Failure) and connection.wait([self._proc.sentinel], 1.0):
                return self._exited()
            return item
        return None

    def _exited(self) -> Failure:
        return Failure(
            LoaderError(f"the loader process exited unexpectedly (exit code {self._proc.exitcode})")
        )

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
        self.handoff.close()
        self._channel.wake()
        self._channel.control(messages.CancelRun(self.id))


class ProcessRuntime(runtime.RuntimeBase):
    """A started loader whose pipeline runs in a loader process (see the module)."""

    def _start(
        self, config: LoaderConfig, device: torch.device, dataset: FileDataset, counters: Counters
    ) -> None:
        ctx = zygote.context()
        where = zygote.address()
        if ctx is None or where is None:
            raise NoZygote
        self.config = config
        self.counters = counters
        self._ids = 0
        self._restores = counters.restores
        conn, child = connection.Pipe(duplex=True)
        back_r, back_w = os.pipe()
        back = Connection(back_r, writable=False)
        self.proc = ctx.Process(
            target=loaderproc.main,
            args=(
                child,
                back,
                pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL),  # its callables by value
                dataset,
                where,
                logging.getLogger("aioloader").getEffectiveLevel(),
            ),
            name=roles.NAMES["loader"],
            # Not a daemon: a daemon may not have children (its decode workers). Shutdown,
            # the exit hook and SIGTERM stop it, and its lifeline ends it with the trainer.
            daemon=False,
        )
        try:
            try:
                self.proc.start()
            finally:
                child.close()
                back.close()
        except BaseException:
            conn.close()
            os.close(back_w)
            raise
        self.channel = _Channel(conn, back_w, counters, slabs_for(config) + 8)
        try:
            self._wait_ready()
            self.copier = DeviceCopier(device, bool(config.delivery.pin_memory))
            self.bridge = Bridge(
                self.copier,
                counters.meters["transfer"],
                device_decode_for(config, device, counters, member=dataset.member),
            )
            # The slabs' mappings are made on the bridge thread, and page-locked there once.
            self.channel.maps.pins = self.copier.pins
        except BaseException:
            self._stop_process(grace=1.0)
            raise
        self.run: PipeRun | None = None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            ready = connection.wait([self.channel.conn, self.proc.sentinel], timeout=max(0.0, left))
            if self.channel.conn in ready:
                try:
                    msg = self.channel.recv()
                except Exception:  # noqa: BLE001 - reported below as an exit
                    msg = None
                if isinstance(msg, messages.Ready):
                    if msg.error is not None:
                        raise wire.unpack_error(msg.error)
                    return
            if not ready or self.proc.sentinel in ready or self.channel.eof:
                self.proc.join(1.0)
                raise LoaderError(
                    f"the loader process did not start (exit code {self.proc.exitcode}); see its output above"
                )

    def start_run(self, epoch: int, resume: ResumePoint | None = None) -> PipeRun:
        """Cancel the current run, if any, and have the loader process produce ``epoch`` from
        ``resume`` (its start when None; does not block). The loader process makes the
        epoch's plan from the two: this process never makes it."""
        with self._lock:
            if self.run is not None:
                self.run.cancel()
            self._ids += 1
            restore: messages.Restore | None = None
            if self.counters.restores != self._restores:
                self._restores = self.counters.restores
                failures, attempted = self.counters.failure_counts_by_reason()
                restore = messages.Restore(failures, attempted)
            run = PipeRun(self.channel, self._ids, self.proc)
            self.channel.control(messages.StartRun(run.id, epoch, resume, restore))
            self.bridge.serve(run)
            self.run = run
            return run

    def _threads(self) -> tuple[threading.Thread, ...]:
        return (self.bridge.thread,)

    def _stop_all(self, run: PipeRun | None, grace: float) -> None:
        try:
            if run is not None:
                run.cancel()
            self.bridge.stop(timeout=grace)
            if self.bridge.thread.is_alive():
                # A bridge that would not stop may still copy from a slab: its page-locking is
                # left to the process's end rather than released under a copy in flight.
                self.channel.maps.pins = None
            self._stop_process(grace)
        finally:
            gcfreeze.release()

    def _stop_process(self, grace: float) -> None:
        """Ask the loader process to close, read what it still sends (so it never blocks on
        a full pipe), and kill it past the deadline."""
        self.channel.control(messages.Close())
        deadline = time.monotonic() + grace + 3.0
        conn = self.channel.conn
        while self.proc.is_alive() and time.monotonic() < deadline:
            ready = connection.wait([conn, self.proc.sentinel], timeout=0.1)
            if conn in ready:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    self.proc.join(max(0.0, deadline - time.monotonic()))
                    break
                self._closing(data)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5.0)
        self.channel.close()
        if self.proc.exitcode is not None:
            if self.proc.exitcode != 0:  # it could not close: killed, or crashed
                _remove_leftovers(self.proc.pid)
            self.proc.close()

    def _closing(self, data: bytes) -> None:
        """A message the loader process sent while closing: the sample cache's last counts
        are taken (its writes that landed after the last batch); the rest (batches nobody
        takes) is dropped."""
        try:
            msg = pickle.loads(data)
        except Exception:  # noqa: BLE001 - a batch that cannot be read here is dropped anyway
            return
        if isinstance(msg, messages.Closed) and msg.cache is not None:
            self.counters.cache = msg.cache


def _remove_leftovers(pid: int | None) -> None:
    """What the loader process ``pid``, now gone, left in ``/dev/shm`` because it did not
    close (killed, by the OOM killer say, or crashed): its decode pool's semaphores and,
    with ``/dev/shm`` slabs, its segments. The resource tracker it shares with this process
    (the zygote is forked after it starts) removes them only when this process ends: a
    trainer that goes on would hold them meanwhile. Removed now, and unregistered there.
    Batches this process still holds keep their mappings: only the names go. Not after a
    clean exit: a loader process that closed removed its own, and any left is a bug to
    see (the tests' leak check), not to hide."""
    if pid is None:
        return
    removed, _ = doctor.remove([e for e in doctor.scan() if e.pid == pid])
    for entry in removed:
        if entry.kind == "semaphore":  # sem.mp-aioloader-<pid>-x is POSIX semaphore /mp-aioloader-<pid>-x
            name, rtype = "/" + entry.name.removeprefix("sem."), "semaphore"
        else:
            name, rtype = "/" + entry.name, "shared_memory"
        # Registered, then unregistered: whether or not the process had registered it (it may
        # have been killed between untracking a segment and unlinking it), it is not after.
        resource_tracker.register(name, rtype)
        resource_tracker.unregister(name, rtype)

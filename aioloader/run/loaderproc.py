"""The loader process (``loader_process="auto"``, the default, or True): the event loop, the
reads, the decode pool and ``collate`` of one loader, away from the trainer's process and its
GIL.

It is forked by the zygote (:mod:`aioloader.procs.zygote`), so it starts in milliseconds with what
the trainer had imported (or, from a zygote started clean, what that preloaded), and asks the
same zygote for its decode workers (:func:`~aioloader.procs.zygote.adopt`). It ends with the
trainer, however the trainer ends (:func:`~aioloader.safety.lifeline.follow_parent`). Its
event loop runs on its main thread.

Two channels join it to the trainer (:mod:`aioloader.run.procruntime`); their messages, with
their fields, are :mod:`aioloader.run.messages`::

    trainer --- control Connection: StartRun CancelRun Close ---------------------->  loader
    trainer <-- the same Connection: Ready BatchMsg EndMsg FailMsg LogMsg Closed ----  loader
    trainer --- back pipe, one os.write per line (a Taken line and its Waited line in one):
                Released "R <slab>" (a batch's views are all garbage), Taken "C <id>" (the
                bridge took an item: one more may be sent), Waited "W <seconds> <batches>"
                (the trainer's totals, with a Taken line when they grew) --------->  loader

The Waited line steers the device decode's hybrid share by the trainer's wait
(:mod:`aioloader.observe.trainerwait`): the loader process's meter is set to its totals.

Flow control: at most ``prefetch`` items of a run are sent and not yet taken. A batch's
value is kept here until the trainer reports its slab released, so the slab is not reused
while the trainer's tensors view it. Items are written by the ``aioloader-send`` thread: a
batch of file bytes (``decode=None``) is larger than the socket's buffer, and its write waits
for the trainer to read; the loop reads the next batch meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
from collections import defaultdict, deque
from multiprocessing.connection import Connection
from typing import Any

from aioloader.base.items import Batch, End, Failure, Item
from aioloader.base.threads import DaemonThreadPool, thread_cpu_clock
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.errors import LoaderError
from aioloader.memory.segments import Segment, choose_kind
from aioloader.plan.resume import ResumePoint, plan_for
from aioloader.procs import roles, zygote
from aioloader.read.urls import is_remote
from aioloader.run.messages import (
    BatchMsg,
    CancelRun,
    Close,
    Closed,
    Control,
    EndMsg,
    FailMsg,
    LogMsg,
    Ready,
    Released,
    Report,
    Restore,
    StartRun,
    Taken,
    Waited,
    parse_back,
)
from aioloader.run.pipeline import Pipeline, build
from aioloader.run.spills import SpillPool
from aioloader.run.wire import Located, encode, pack_error, spill
from aioloader.safety import lifeline

__all__ = ["main"]

logger = logging.getLogger("aioloader")


def main(
    conn: Connection,
    back: Connection,
    pickled_config: bytes,
    dataset: FileDataset,
    where: zygote.Address | None,
    log_level: int = logging.WARNING,
) -> None:
    """The loader process's whole life (the ``target`` the trainer starts it with);
    ``pickled_config``: the :class:`LoaderConfig`, unpickled here so that a callable that
    does not load in this process is the trainer's error at start, not this process's
    traceback; ``log_level``: the trainer's ``aioloader`` logger's, when it started this
    process."""
    roles.become("loader")
    lifeline.follow_parent()
    torch = sys.modules.get("torch")  # imported by the trainer (or preloaded by the zygote)
    if torch is not None:
        # One intra-op thread, as DataLoader's workers and ours have: the trainer's OpenMP
        # pool did not survive the fork, and a parallel torch op here (a collate's, or a
        # large copy) would wait for its threads forever (seen on 16 cores, RESULTS §21).
        torch.set_num_threads(1)
    # The trainer owns shutdown: a Ctrl-C reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what was copied from the trainer is never collected here
    if where is not None:
        zygote.adopt(where)
    send = Sender(conn)
    _forward_logs(send, log_level)
    try:
        config: LoaderConfig = pickle.loads(pickled_config)
    except BaseException as exc:  # noqa: BLE001 - the trainer raises it
        send(Ready(pack_error(exc)))
        return
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is optional
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(Host(conn, back, config, dataset, send).serve())
    finally:
        loop.close()


class Sender:
    """Sends on the Connection from any thread (the loop's, and a log line's)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def __call__(self, msg: Report) -> None:
        self.raw(pickle.dumps(msg, protocol=5))

    def raw(self, data: bytes) -> None:
        with self.lock:
            self.conn.send_bytes(data)


def _forward_logs(send: Sender, level: int) -> None:
    """``aioloader`` log records of ``level`` and up go to the trainer, whose handlers emit
    them."""
    log = logging.getLogger("aioloader")
    log.setLevel(level)
    for h in list(log.handlers):
        log.removeHandler(h)
    log.propagate = False

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                record.msg, record.args = record.getMessage(), None
                if record.exc_info:
                    record.exc_text = logging.Formatter().formatException(record.exc_info)
                    record.exc_info = None
                send(LogMsg(record))
            except Exception:  # noqa: BLE001 - a log line must never stop loading
                pass

    log.addHandler(Forward())


class Host:
    """Serves the trainer's runs with one :class:`~aioloader.run.pipeline.Pipeline`."""

    def __init__(
        self, conn: Connection, back: Connection, config: LoaderConfig, dataset: FileDataset, send: Sender
    ) -> None:
        self.conn = conn
        self.back = back
        self.config = config
        self.dataset = dataset
        self.send = send
        self.counters = config.counters(is_remote(dataset.path(0)))
        self.parts: Pipeline | None = None
        self.task: asyncio.Task[None] | None = None
        self.run_id = -1
        self.credits: asyncio.Semaphore | None = None
        # The values of batches the trainer still views, by slab name.
        self.held: defaultdict[str, deque[Any]] = defaultdict(deque)
        self._partial = b""
        # Where spilled leaves go (aioloader/run/wire.py): as the slabs do, or nowhere. As
        # many are kept for reuse as batches can be on their way to the trainer, and two.
        try:
            kind = choose_kind()
        except LoaderError:  # a bad AIOLOADER_SLABS: the pipeline's build reports it
            kind = None
        self.spills = SpillPool(kind, config.delivery.prefetch + 2) if kind is not None else None
        self._sender = DaemonThreadPool(1, thread_name_prefix="aioloader-send")

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.closed = asyncio.Event()
        # This thread runs the loop: its CPU share is the verdict's "loop" stage, sent with the others.
        self.counters.loop.bind(thread_cpu_clock(threading.current_thread()))
        try:
            parent = mp.parent_process()  # the trainer: the tuner leaves its CPUs alone
            self.parts = build(
                self.config, self.dataset, self.counters, parent.pid if parent is not None else None
            )
        except BaseException as exc:  # noqa: BLE001 - the trainer raises it
            self.send(Ready(pack_error(exc)))
            return
        # The control messages are read by a thread of their own: the loop's add_reader would
        # make the socket non-blocking, and it is also the one the items are written to.
        threading.Thread(
            target=self._read_control, args=(loop,), name="aioloader-control", daemon=True
        ).start()
        loop.add_reader(self.back.fileno(), self._on_back)
        self.send(Ready(None))
        try:
            await self.closed.wait()
        finally:
            loop.remove_reader(self.back.fileno())
            await self._stop_run()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5)
            for values in self.held.values():
                for value in values:
                    if isinstance(value, Segment):
                        value.close()
            self.held.clear()
            if self.spills is not None:
                self.spills.close()
            try:
                await asyncio.wait_for(self.parts.aclose(), timeout=2.0)
            except Exception:  # noqa: BLE001 - closing must go on
                pass
            self.parts.close(grace=1.0)
            # Bounded: the trainer reads what is still sent while it waits for this process.
            self._sender.shutdown(wait=True, cancel_futures=True, grace=1.0)
            # Last: the sample cache's counts as closing left them (its last writes landed
            # after the last batch's counts were sent), for the trainer's stats.
            try:
                self.send(Closed(self.counters.cache))
            except OSError:  # the trainer is gone
                pass

    def _read_control(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            msg: Control
            try:
                msg = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                msg = Close()
            try:
                loop.call_soon_threadsafe(self._on_control, msg)
            except RuntimeError:  # the loop is closed: the process is ending
                return
            if isinstance(msg, Close):
                return

    def _on_control(self, msg: Control) -> None:
        match msg:
            case StartRun():
                self._start_run(msg.run_id, msg.epoch, msg.resume, msg.restore)
            case CancelRun():
                if msg.run_id == self.run_id and self.task is not None:
                    self.task.cancel()
            case Close():
                self.closed.set()

    def _on_back(self) -> None:
        try:
            data = os.read(self.back.fileno(), 65536)
        except OSError:
            data = b""
        if not data:
            self.closed.set()
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            msg = parse_back(line)
            if isinstance(msg, Released):
                values = self.held.get(msg.slab)
                if values:
                    value = values.popleft()  # its views go: the slab returns to the pool
                    if isinstance(value, Segment) and self.spills is not None:
                        self.spills.give(value)  # for the next batch's spilled leaves
                        del self.held[msg.slab]
            elif isinstance(msg, Taken):
                if msg.run_id == self.run_id and self.credits is not None:
                    self.credits.release()
            elif isinstance(msg, Waited):
                self.counters.trainer_wait.set_totals(msg.seconds, msg.batches)

    def _start_run(
        self, run_id: int, epoch: int, resume: ResumePoint | None, restore: Restore | None
    ) -> None:
        if self.task is not None:
            self.task.cancel()
        if restore is not None:
            self.counters.restore_failures(restore.failures, restore.attempted)
        self.run_id = run_id
        self.credits = asyncio.Semaphore(self.config.delivery.prefetch)
        # The one place a loader process's epoch plan is made: the trainer sent (epoch, resume).
        runs = self.dataset.runs() if self.config.sampling.locality is not None else None
        plan = plan_for(self.config.sampling, len(self.dataset), epoch, resume, runs)
        self.task = asyncio.get_running_loop().create_task(self._run(run_id, plan, self.credits))

    async def _stop_run(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self, run_id: int, plan: Any, credits: asyncio.Semaphore) -> None:
        assert self.parts is not None
        queue: asyncio.Queue[Item] = asyncio.Queue(1)
        producer = asyncio.get_running_loop().create_task(self.parts.engine.produce(plan, queue))
        try:
            while True:
                # A credit first: a batch finished while none is free stays in the engine's
                # queue of one, and the engine does not start another (one slab fewer held).
                await credits.acquire()
                item = await queue.get()
                try:
                    data = self._encode_item(run_id, item)
                    if data is not None:  # written by the sender thread, in order: awaited
                        await asyncio.get_running_loop().run_in_executor(self._sender, self.send.raw, data)
                except Exception as exc:  # noqa: BLE001 - a bug of ours must still reach the trainer
                    err = LoaderError(f"loading stopped: {type(exc).__name__}: {exc}")
                    err.__cause__ = exc
                    self.send(FailMsg(run_id, pack_error(err), self.counters.loader_side()))
                    return
                if not isinstance(item, Batch):
                    return
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)

    def _encode_item(self, run_id: int, item: Item) -> bytes | None:
        """A batch's message, to be written; an end or a failure is sent now (None)."""
        counts = self.counters.loader_side()
        if isinstance(item, End):
            self.send(EndMsg(run_id, counts))
            return None
        if isinstance(item, Failure):
            self.send(FailMsg(run_id, pack_error(item.error), counts))
            return None
        slabs = self.parts.slabs.live_slabs() if self.parts is not None and self.parts.slabs else []
        located = [Located(s.handle, s.address, s.layout.size) for s in slabs]
        treedef, leaves, handles = encode(item.value, located)
        spilled = spill(leaves, handles, self.spills.take) if self.spills is not None else []
        if not spilled and self.spills is not None:
            self.spills.unused()
        msg = BatchMsg(run_id, item.index, item.size, item.done, treedef, leaves, handles, counts)
        try:
            data = pickle.dumps(msg, protocol=5)
        except Exception as exc:  # noqa: BLE001 - the trainer learns why, in order
            err = LoaderError(
                f"batch {item.index} cannot be sent from the loader process to the trainer's "
                f"(loader_process=False collates there): {type(exc).__name__}: {exc}"
            )
            self.send(FailMsg(run_id, pack_error(err), counts))
            for segment in spilled:
                self.spills.give(segment)  # type: ignore[union-attr]
            return None
        for handle in handles[: len(handles) - len(spilled)]:
            self.held[handle.name].append(item.value)
        for segment in spilled:  # back to the pool when the trainer lets go of it
            self.held[segment.handle.name].append(segment)
        return data

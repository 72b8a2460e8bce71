"""The ``aioloader-transfer`` bridging thread and the per-epoch :class:`Run` it serves.

The thread sits between the engine's ready queue (an ``asyncio.Queue`` on the loader's loop)
and the trainer: it pulls each batch, has :class:`~aioloader.run.device.DeviceCopier` copy it to
the device, and puts it into the run's :class:`~aioloader.run.handoff.Handoff`. With a device
decode it pulls through a decode thread that starts each batch's decode a batch ahead
(:mod:`aioloader.run.decodeahead`) and finishes the batch before its copy
(:mod:`aioloader.decode.ondevice.bridgeside`; :func:`device_decode_for` makes it). Runs are
served one after another; a cancelled run is abandoned at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from aioloader.base.items import Batch, End, Failure, Item
from aioloader.config import LoaderConfig
from aioloader.decode.ondevice import decodes_on_device
from aioloader.decode.ondevice.bridgeside import DeviceDecode
from aioloader.engine.failures import FailurePolicy
from aioloader.errors import LoaderError
from aioloader.observe.stages import StageMeter
from aioloader.observe.stats import Counters, DeviceDecodeStats
from aioloader.run.decodeahead import DecodeAhead
from aioloader.run.device import DeviceCopier
from aioloader.run.handoff import Handoff

__all__ = ["Bridge", "Run", "Source", "device_decode_for"]


class Source(Protocol):
    """What the bridge serves: a :class:`Run` on this process's loop, or a
    :class:`~aioloader.run.procruntime.PipeRun` from a loader process."""

    handoff: Handoff[Item]

    @property
    def cancelled(self) -> bool: ...

    def next_ready(self) -> Item | None: ...

    def cancel(self) -> None: ...


class Run:
    """One pass over an epoch: the engine's task and ready queue, and the hand-off to the
    trainer. ``cancel`` may be called from any thread, any number of times."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prefetch: int) -> None:
        self.loop = loop
        # Created off-loop: asyncio.Queue binds to a loop on first use, not here.
        self.queue: asyncio.Queue[Item] = asyncio.Queue(prefetch)
        self.handoff: Handoff[Item] = Handoff(1)
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[Item] | None = None

    def next_ready(self) -> Item | None:
        """Next item of the ready queue, from the bridging thread; None once cancelled."""
        with self._lock:
            if self.cancelled:
                return None
            fut = asyncio.run_coroutine_threadsafe(self.queue.get(), self.loop)
            self._pending = fut
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            return None
        finally:
            self._pending = None

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            pending = self._pending
        self.handoff.close()
        if pending is not None:
            pending.cancel()
        try:
            self.loop.call_soon_threadsafe(self._cancel_task)
        except RuntimeError:  # the loop is already closed: nothing runs there any more
            pass

    def _cancel_task(self) -> None:
        if self.task is not None:
            self.task.cancel()


class Bridge:
    """The ``aioloader-transfer`` thread: serves runs one after another until stopped."""

    def __init__(
        self, copier: DeviceCopier, meter: StageMeter | None = None, finish: DeviceDecode | None = None
    ) -> None:
        self.copier = copier
        #: The device decode (``ImageDecoder(device=...)``): each batch is finished on the
        #: device before its copy.
        self.finish = finish
        self.meter = meter if meter is not None else StageMeter("transfer")
        self._runs: queue.SimpleQueue[Source | None] = queue.SimpleQueue()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="aioloader-transfer", daemon=True)
        self.thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise LoaderError(f"cannot start the transfer thread for {copier.device}") from self._start_error

    def serve(self, run: Source) -> None:
        self._runs.put(run)

    def stop(self, timeout: float) -> None:
        self._runs.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _main(self) -> None:
        try:
            self.copier.start()
            if self.finish is not None:
                self.finish.start()
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            self._start_error = exc
            self._started.set()
            self.copier.close()
            return
        self._started.set()
        try:
            while (run := self._runs.get()) is not None:
                self._serve(run)
        finally:
            self.copier.close()  # first: its stream's work, the decoder's included, completes
            if self.finish is not None:
                self.finish.close()

    def _to_device(self, item: Batch) -> Batch | Failure:
        """``item`` on the device (decoded there first, with a device decode), or its
        failure, which goes to the trainer in order."""
        try:
            if self.finish is not None:
                item.value = self.finish.finish(item.value, self.copier)
            item.value, item.event = self.copier.to_device(item.value)
            return item
        except LoaderError as exc:  # a sample the device decode could not decode, or one too many
            self.copier.settle_failed()
            return Failure(exc)
        except Exception as exc:  # noqa: BLE001
            self.copier.settle_failed()
            err = LoaderError(f"copying batch {item.index} to {self.copier.device} failed: {exc}")
            err.__cause__ = exc
            return Failure(err)

    def _serve(self, run: Source) -> None:
        # A device decode starts each batch's decode on a thread of its own, a batch ahead.
        finish = self.finish
        ahead = DecodeAhead(run, finish.begin, finish.bind) if finish is not None else None
        source: Source = ahead if ahead is not None else run
        try:
            while (item := source.next_ready()) is not None:
                if isinstance(item, Batch):
                    with self.meter.timed():
                        item = self._to_device(item)
                elif isinstance(item, End) and self.finish is not None:
                    item = self.finish.ended(item)
                delivered = run.handoff.put(item)
                # The copies of a batch read its slabs: they go back to the loader once those
                # completed; the newest batch's may go on while the next one is fetched.
                self.copier.settle(keep=1)
                if not delivered or isinstance(item, (End, Failure)):
                    return
        finally:
            run.handoff.close()
            if ahead is not None:
                ahead.close()


def device_decode_for(
    config: LoaderConfig,
    device: torch.device,
    counters: Counters,
    policy: FailurePolicy | None = None,
    member: Callable[[int], str | None] | None = None,
) -> DeviceDecode | None:
    """The bridge's device decode for a loader of ``config`` delivering on ``device`` (settled),
    if its decoder asks for one;
    ``policy``: the loader's failure policy where it runs in this process (its engine's), or
    None for one of its own on the same ``counters`` (a loader process has the engine's),
    naming the tar member of a failed sample by ``member`` (``FileDataset.member``)."""
    decoder = config.decoding.decode
    if not decodes_on_device(decoder):
        return None
    counters.device = DeviceDecodeStats()
    if policy is None:
        policy = FailurePolicy(config.failures.on_error, config.failures.max_failures, counters, member)
    return DeviceDecode(decoder, device, counters, policy)

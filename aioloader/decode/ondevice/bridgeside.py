"""The device decode on the trainer's side: a half-decoded batch to its tensor on the device.

With ``ImageDecoder(device=...)`` a batch reaches the bridge as an
:class:`~aioloader.decode.encoded.EncodedBatch` (alone, or with its labels), carrying its
resize plan, made on the loader's side. Two threads finish it, so that neither waits on the
other's host work:

1. the decode thread (:mod:`aioloader.run.decodeahead`), one batch ahead of the bridge,
   :meth:`DeviceDecode.begin`: allocates the batch's padded ``(G, Hmax, Wmax, 3)`` buffer from
   PyTorch's caching allocator on its own stream, has the batch decoder
   (:mod:`aioloader.decode.batchdec`) decode the images into it, and records an event;
2. the bridging thread, :meth:`DeviceDecode.finish`, on the copier's side stream: waits (on
   the device, not the host) for that event, makes the batch's ``(rows, 3, H, W)`` ``uint8``
   tensor, copies the rows the CPU workers decoded into their places, copies the plan's taps,
   crops, resizes and flips all the decoded images at once (:func:`~aioloader.decode.resize.
   resize_batch`: a few kernels whatever the batch size) straight into their rows, and decodes
   what the device could not with Pillow here, with the same windows; it holds the host bytes
   until the batch's copy event has completed.

The batch then goes on as any other: its labels copied, an event recorded after all of the
side stream's work, the trainer's stream made to wait on it. A sample that neither decoder
can decode is a :class:`~aioloader.DecodeError` naming its file, which goes through the
loader's failure policy (:class:`~aioloader.engine.failures.FailurePolicy`) as any failed
sample: with ``on_error="raise"`` the batch's failure; with ``"skip"`` its row is left out
of the batch, counted in ``stats.failures`` (and in ``stats.device_decode.fallbacks``),
logged once per file, and judged by ``max_failures`` (a fraction at the epoch's end too:
:meth:`DeviceDecode.ended`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from aioloader.base.items import Batch, End, Failure, Item
from aioloader.decode.batchdec import BatchDecoder, batch_decoder_for
from aioloader.decode.encoded import EncodedBatch
from aioloader.decode.image import ImageDecoder
from aioloader.decode.resize import resize_batch
from aioloader.errors import DecodeError, LoaderError, SampleError
from aioloader.observe.stats import Counters


class PolicyLike(Protocol):
    """What the device decode asks of the loader's failure policy
    (:class:`~aioloader.engine.failures.FailurePolicy`, a wing above: run/bridge.py hands it in)."""

    on_error: str

    def failed(self, err: SampleError) -> None: ...

    def epoch_ended(self) -> None: ...


class CopierLike(Protocol):
    """What the device decode asks of the bridge's copier (:class:`~aioloader.run.device.DeviceCopier`,
    a wing above): its stream, copies onto it, and values held until the work queued on it ran."""

    @property
    def stream(self) -> Any: ...

    def on_stream(self) -> AbstractContextManager[Any]: ...

    def copy_tensor(self, t: torch.Tensor) -> torch.Tensor: ...

    def hold(self, value: Any) -> None: ...


__all__ = ["DeviceDecode", "Started"]


@dataclass
class Started:
    """An encoded ``batch`` whose decode is under way: its images in ``buffer`` (None
    without any, or where ``error`` ended the decode), the positions that ``failed``, the
    ``event`` recorded after the decode on the decode stream (None on the CPU), and the
    decode thread's ``seconds``."""

    batch: EncodedBatch
    buffer: torch.Tensor | None
    failed: list[int]
    event: Any = None
    seconds: float = 0.0
    error: Exception | None = None


def _parts(value: Any) -> tuple[Any, Any]:
    """``(encoded or started batch, labels or None)`` of a batch's value."""
    if isinstance(value, tuple) and not isinstance(value, EncodedBatch) and len(value) == 2:
        return value[0], value[1]
    return value, None


class DeviceDecode:
    """The trainer side of ``decoder`` on ``device`` (see the module docstring); ``policy``
    judges the samples it cannot decode; ``make`` chooses the batch decoder (tests pass
    their own)."""

    def __init__(
        self,
        decoder: ImageDecoder,
        device: torch.device,
        counters: Counters,
        policy: PolicyLike,
        make: Callable[[ImageDecoder, torch.device], BatchDecoder] = batch_decoder_for,
    ) -> None:
        self.decoder = decoder
        self.device = device
        self._counters = counters
        self.policy = policy
        self._make = make
        self.batch: BatchDecoder | None = None
        self._stream: Any = None  # the decode thread's CUDA stream (None on the CPU)

    def start(self) -> None:
        """On the bridging thread, its device bound."""
        self.batch = self._make(self.decoder, self.device)
        self.batch.start()
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
            self._stream = None
        if self.batch is not None:
            self.batch.close()
            self.batch = None

    def bind(self) -> None:
        """On the decode thread (:mod:`aioloader.run.decodeahead`), as it starts: its CUDA
        device made the decoder's."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def begin(self, item: Item) -> Item:
        """On the decode thread: ``item`` with its encoded batch's decode started (anything
        else as it is)."""
        if not isinstance(item, Batch):
            return item
        encoded, labels = _parts(item.value)
        if isinstance(encoded, EncodedBatch):
            started = self._begin(encoded)
            item.value = started if labels is None else (started, labels)
        return item

    def _begin(self, batch: EncodedBatch) -> Started:
        assert self.batch is not None, "start() was not called"
        start = time.perf_counter()
        count = len(batch.gpu_rows)
        if not count:
            return Started(batch, None, [])
        try:
            with torch.cuda.stream(self._stream) if self._stream is not None else nullcontext():
                height, width = (int(v) for v in batch.sizes.max(axis=0))
                shape = (count, height, width, 3)
                buffer = torch.empty(shape, dtype=torch.uint8, device=self.device)
                datas = [batch.encoded(i) for i in range(count)]
                failed = self.batch.decode(datas, batch.sizes, buffer, self._stream)
                event = None
                if self._stream is not None:
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(self._stream)
        except Exception as exc:  # noqa: BLE001 - the batch's failure, raised by the bridge in order
            return Started(batch, None, [], error=exc)
        return Started(batch, buffer, failed, event, time.perf_counter() - start)

    def finish(self, value: Any, copier: CopierLike) -> Any:
        """``value`` with its encoded batch decoded on the device (anything else as it is);
        on the bridging thread."""
        started, labels = _parts(value)
        if isinstance(started, EncodedBatch):  # not begun ahead (a caller without the thread)
            started = self._begin(started)
        if not isinstance(started, Started):
            return value
        if started.error is not None:
            raise started.error
        encoded = started.batch
        start = time.perf_counter()
        with copier.on_stream():  # all of it: the batch's event, recorded there, covers it
            if started.event is not None and started.buffer is not None:
                copier.stream.wait_event(started.event)
                started.buffer.record_stream(copier.stream)  # freed on the decode stream
            out, dropped = self._decode(started, copier)
            if dropped:
                keep = torch.from_numpy(np.setdiff1d(np.arange(encoded.rows), np.asarray(dropped)))
                out = out.index_select(0, copier.copy_tensor(keep))
                labels = labels[keep] if labels is not None else None
        copier.hold(encoded)  # its bytes, read by work still queued on the streams
        done = len(encoded.gpu_rows) - len(started.failed)
        seconds = time.perf_counter() - start + started.seconds
        self._counters.device_decoded(done, seconds, len(started.failed))
        return out if labels is None else (out, labels)

    def _decode(self, started: Started, copier: CopierLike) -> tuple[torch.Tensor, list[int]]:
        batch = started.batch
        out = torch.empty((batch.rows, 3, batch.height, batch.width), dtype=torch.uint8, device=self.device)
        if len(batch.cpu_rows):
            rows = copier.copy_tensor(torch.from_numpy(batch.cpu_rows))
            out.index_copy_(0, rows, copier.copy_tensor(torch.from_numpy(batch.images)))
        if started.buffer is not None:
            dx, nx, dy, ny = batch.digits
            xi, xc, yi, yc = (
                copier.copy_tensor(torch.from_numpy(a))
                for a in (batch.xindex, batch.xcoef, batch.yindex, batch.ycoef)
            )
            pixels = resize_batch(started.buffer, (xi, xc, dx, nx), (yi, yc, dy, ny), batch.across_first)
            out.index_copy_(0, copier.copy_tensor(torch.from_numpy(batch.gpu_rows)), pixels)
        dropped: list[int] = []
        again: list[int] = []
        pixels_cpu = np.empty((len(started.failed), 3, batch.height, batch.width), dtype=np.uint8)
        for i in started.failed:  # decoded again here, with Pillow, into one buffer copied at once
            try:
                pixels_cpu[len(again)] = self.decoder.decode_window(
                    bytes(batch.encoded(i)), batch.box(i), bool(batch.flips[i])
                )
            except Exception as exc:  # noqa: BLE001 - judged by on_error below
                dropped.append(int(batch.gpu_rows[i]))
                self._undecodable(batch.paths[i], int(batch.indices[i]), exc)
                continue
            again.append(int(batch.gpu_rows[i]))
        if again:
            rows = copier.copy_tensor(torch.tensor(again, dtype=torch.int64))
            out.index_copy_(0, rows, copier.copy_tensor(torch.from_numpy(pixels_cpu[: len(again)])))
        return out, dropped

    def _undecodable(self, path: str, index: int, exc: Exception) -> None:
        """The policy's verdict on a sample neither decoder could decode: raised (the batch's
        failure), or counted, logged once and left out."""
        err = DecodeError(
            f"decode failed on the device and again with Pillow: {type(exc).__name__}: {exc}",
            path=path,
            index=index,
        )
        err.__cause__ = exc
        if self.policy.on_error == "skip":
            # Kept by the policy as its latest failure: without the frames that hold the batch.
            exc.__traceback__ = None
            self._counters.device_decoded(0, 0.0, 0, undecodable=1)
        self.policy.failed(err)

    def ended(self, item: End) -> End | Failure:
        """The epoch's end, or the :class:`~aioloader.LoaderError` of a fractional
        ``max_failures`` over (in its place) with the failures counted here."""
        try:
            self.policy.epoch_ended()
        except LoaderError as exc:
            return Failure(exc)
        return item

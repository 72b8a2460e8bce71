"""The device decode on the bridging thread: a half-decoded batch to its tensor on the device.

With ``ImageDecoder(device=...)`` a batch reaches the bridge as an
:class:`~aioloader.decode.encoded.EncodedBatch` (alone, or with its labels). Before the
batch's copy, :meth:`DeviceDecode.finish`, on the copier's side stream:

1. makes the batch's ``(rows, 3, H, W)`` ``uint8`` tensor on the device;
2. copies the rows the CPU workers decoded into their places (from their page-locked
   slab, as any batch: :meth:`~aioloader.run.device.DeviceCopier.copy_tensor`);
3. has the batch decoder (:mod:`aioloader.decode.batchdec`) decode the encoded images into
   theirs, and decodes what it could not with Pillow here, with the same windows;
4. holds the host bytes until the batch's copy event has completed.

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
from typing import Any

import numpy as np
import torch

from aioloader.base.items import End, Failure
from aioloader.config import LoaderConfig
from aioloader.decode.batchdec import BatchDecoder, batch_decoder_for
from aioloader.decode.encoded import EncodedBatch
from aioloader.decode.image import ImageDecoder
from aioloader.engine.failures import FailurePolicy
from aioloader.errors import DecodeError, LoaderError
from aioloader.observe.stats import Counters, DeviceDecodeStats
from aioloader.run.device import DeviceCopier

__all__ = ["DeviceDecode", "device_decode_for"]


class DeviceDecode:
    """The bridge's part of ``decoder`` on ``device`` (see the module docstring); ``policy``
    judges the samples it cannot decode; ``make`` chooses the batch decoder (tests pass
    their own)."""

    def __init__(
        self,
        decoder: ImageDecoder,
        device: torch.device,
        counters: Counters,
        policy: FailurePolicy,
        make: Callable[[ImageDecoder, torch.device], BatchDecoder] = batch_decoder_for,
    ) -> None:
        self.decoder = decoder
        self.device = device
        self._counters = counters
        self.policy = policy
        self._make = make
        self.batch: BatchDecoder | None = None

    def start(self) -> None:
        """On the bridging thread, its device bound."""
        self.batch = self._make(self.decoder, self.device)
        self.batch.start()

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()
            self.batch = None

    def finish(self, value: Any, copier: DeviceCopier) -> Any:
        """``value`` with its encoded batch decoded on the device (anything else as it is)."""
        labels = None
        encoded = value
        if isinstance(value, tuple) and not isinstance(value, EncodedBatch) and len(value) == 2:
            encoded, labels = value
        if not isinstance(encoded, EncodedBatch):
            return value
        start = time.perf_counter()
        with copier.on_stream():  # all of it: the batch's event, recorded there, covers it
            out, failed, dropped = self._decode(encoded, copier)
            if dropped:
                keep = torch.from_numpy(np.setdiff1d(np.arange(encoded.rows), np.asarray(dropped)))
                out = out.index_select(0, copier.copy_tensor(keep))
                labels = labels[keep] if labels is not None else None
        copier.hold(encoded)  # its bytes, read by work still queued on the stream
        done = len(encoded.gpu_rows) - len(failed)
        self._counters.device_decoded(done, time.perf_counter() - start, len(failed))
        return out if labels is None else (out, labels)

    def _decode(self, batch: EncodedBatch, copier: DeviceCopier) -> tuple[torch.Tensor, list[int], list[int]]:
        assert self.batch is not None, "start() was not called"
        out = torch.empty((batch.rows, 3, batch.height, batch.width), dtype=torch.uint8, device=self.device)
        if len(batch.cpu_rows):
            rows = copier.copy_tensor(torch.from_numpy(batch.cpu_rows))
            out.index_copy_(0, rows, copier.copy_tensor(torch.from_numpy(batch.images)))
        datas = [batch.encoded(i) for i in range(len(batch.gpu_rows))]
        views = [out[int(r)] for r in batch.gpu_rows]
        failed = self.batch.decode(datas, batch.boxes, batch.flips, views, copier.stream) if views else []
        dropped: list[int] = []
        again: list[int] = []
        pixels = np.empty((len(failed), 3, batch.height, batch.width), dtype=np.uint8)
        for i in failed:  # decoded again here, with Pillow, into one buffer copied at once
            try:
                pixels[len(again)] = self.decoder.decode_window(
                    bytes(datas[i]), batch.box(i), bool(batch.flips[i])
                )
            except Exception as exc:  # noqa: BLE001 - judged by on_error below
                dropped.append(int(batch.gpu_rows[i]))
                self._undecodable(batch.paths[i], int(batch.indices[i]), exc)
                continue
            again.append(int(batch.gpu_rows[i]))
        if again:
            rows = copier.copy_tensor(torch.tensor(again, dtype=torch.int64))
            out.index_copy_(0, rows, copier.copy_tensor(torch.from_numpy(pixels[: len(again)])))
        return out, failed, dropped

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


def device_decode_for(
    config: LoaderConfig, counters: Counters, policy: FailurePolicy | None = None
) -> DeviceDecode | None:
    """The bridge's device decode for a loader of ``config``, if its decoder asks for one;
    ``policy``: the loader's failure policy where it runs in this process (its engine's), or
    None for one of its own on the same ``counters`` (a loader process has the engine's)."""
    decoder = config.decode
    if not isinstance(decoder, ImageDecoder) or decoder.device is None:
        return None
    counters.device = DeviceDecodeStats()
    if policy is None:
        policy = FailurePolicy(config.on_error, config.max_failures, counters)
    return DeviceDecode(decoder, config.device, counters, policy)

"""The device decode's stage in the loader: which samples the GPU decodes, which the CPU.

``ImageDecoder(device="cuda")``: the loader does not decode the JPEGs the GPU takes; it
sends their bytes, with the crop window drawn for each, to the bridging thread, which decodes
the batch on the device (:mod:`aioloader.run.devdecode`). :class:`DeviceDecodeStage` wraps
the local pool's stage (:class:`~aioloader.decode.stage.DecodeStage`) and, per chunk:

1. screens each sample's first bytes and its last (:mod:`aioloader.decode.jpeg`): what the
   device cannot take, and a JPEG cut short, go to the CPU workers (counted by reason);
2. gives the CPU workers their share of the rest (:mod:`aioloader.decode.hybrid`), the
   chunk's last rows, steered by the workers' utilization and the trainer's wait for batches
   (:mod:`aioloader.observe.trainerwait`);
3. answers every other sample with :class:`~aioloader.memory.results.Deferred`: an
   :class:`~aioloader.decode.encoded.EncodedImage` whose window is drawn from
   ``(seed, epoch, index)`` as :meth:`~aioloader.ImageDecoder.window` draws it in a worker.

It is a :class:`~aioloader.decode.contract.DecodeStageLike`: the engine does not know it from
the pool's stage. Loop-bound.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from aioloader.decode.contract import ChunkItem, DecodeStageLike, Outcome
from aioloader.decode.encoded import EncodedImage
from aioloader.decode.hybrid import HybridShare
from aioloader.decode.image import ImageDecoder
from aioloader.decode.jpeg import JpegHeader, jpeg_complete, jpeg_header, not_on_device
from aioloader.memory.results import Deferred
from aioloader.observe.stages import StageMeter, between, utilization
from aioloader.observe.trainerwait import TrainerWait, WaitReading, wait_share

if TYPE_CHECKING:
    from aioloader.decode.protocol import Shrink
    from aioloader.memory.slabs import Slab

__all__ = ["DeviceDecodeStage", "sample_generator"]


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator :func:`aioloader.sample_rng` gives a worker decoding ``index``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, index])))


class DeviceDecodeStage:
    """See the module docstring. ``report(cpu, reasons, share, why)`` is told, per chunk, how
    many samples went to the CPU workers and why, and the share now and why
    (:meth:`~aioloader.observe.stats.Counters.device_loader_side`); ``wait``: the trainer's
    wait meter the share is steered by (None: by the workers' utilization alone)."""

    def __init__(
        self,
        inner: DecodeStageLike,
        decoder: ImageDecoder,
        *,
        seed: int,
        path_of: Callable[[int], str],
        meter: StageMeter,
        report: Callable[[int, dict[str, int], float, str], None],
        share: HybridShare | None = None,
        wait: TrainerWait | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._decoder = decoder
        self._seed = seed
        self._path_of = path_of
        self._meter = meter
        self._report = report
        self.share = share if share is not None else HybridShare()
        self._clock = clock
        self._last = meter.snapshot(percentiles=False)
        self._wait = wait
        # The wait meter's reading the next wait share is measured from, when it was taken,
        # and the latest share measured (None before the first).
        self._wait_from: tuple[WaitReading, float] | None = None
        self._wait_seen: float | None = None
        self.chunk = inner.chunk
        self.probes = inner.probes
        self.samples_in_flight = inner.samples_in_flight
        self.reads_urls = False

    @property
    def active(self) -> int:
        return self._inner.active

    @active.setter
    def active(self, value: int) -> None:
        self._inner.active = value

    def set_workers(self, active: int) -> None:
        self._inner.set_workers(active)

    async def run(
        self,
        epoch: int,
        k: int,
        slab: Slab | None,
        items: list[ChunkItem],
        out: tuple[int, int] | None = None,
        inputs: Slab | None = None,
        shrink: Shrink | None = None,
    ) -> list[Outcome]:
        self._adjust()
        arena = inputs.input.buf if inputs is not None else None
        datas = [_bytes_of(src, arena) for _, _, src in items]
        reasons: Counter[str] = Counter()
        device: list[tuple[int, JpegHeader]] = []
        cpu: list[int] = []
        for pos, data in enumerate(datas):
            header = jpeg_header(data)
            why = not_on_device(header, complete=jpeg_complete(data))
            if why is None and header is not None:
                device.append((pos, header))
            else:
                reasons[why or "not a JPEG"] += 1
                cpu.append(pos)
        share = self.share.cpu_count(len(device))
        if share:
            cpu = sorted(cpu + [pos for pos, _ in device[len(device) - share :]])
            device = device[: len(device) - share]
        outcomes: list[Outcome | None] = [None] * len(items)
        if cpu:
            done = await self._inner.run(epoch, k, slab, [items[p] for p in cpu], out, inputs)
            for p, outcome in zip(cpu, done, strict=True):
                outcomes[p] = outcome
        for p, header in device:
            outcomes[p] = Deferred(self._encoded(epoch, items[p][1], bytes(datas[p]), header))
        self._report(len(cpu), dict(reasons), self.share.share, self.share.reason)
        return [o for o in outcomes if o is not None]

    def _encoded(self, epoch: int, index: int, data: bytes, header: JpegHeader) -> EncodedImage:
        dec = self._decoder
        box, flip = dec.window(
            header.width, header.height, lambda: sample_generator(self._seed, epoch, index)
        )
        size = (header.height, header.width)
        path = self._path_of(index)
        return EncodedImage(data, box, flip, index, path, dec.height, dec.width, size, dec.resample)

    def _adjust(self) -> None:
        """Move the workers' share by their utilization and the trainer's wait since the
        last adjustment."""
        now = self._clock()
        if self._wait is not None and self._wait_from is None:
            self._wait_from = (self._wait.totals(), now)
        if not self.share.due(now):
            return
        snap = self._meter.snapshot(percentiles=False)
        self.share.observe(utilization(between(self._last, snap)), now, self._trainer_wait(now))
        self._last = snap

    def _trainer_wait(self, now: float) -> float | None:
        """The trainer's wait share since the last batch it was measured at; with no batch
        delivered since, the latest measured (a trainer in a long step would otherwise flip
        the share to the workers' rule every other interval), None before the first."""
        if self._wait is None or self._wait_from is None:
            return None
        reading = self._wait.totals()
        (before, since) = self._wait_from
        measured = wait_share(before, reading, now - since)
        if measured is not None:
            self._wait_from, self._wait_seen = (reading, now), measured
        return self._wait_seen


def _bytes_of(src: object, arena: memoryview | None) -> bytes | memoryview:
    """A sample's bytes: as read, or its ``(offset, size)`` in the batch's input arena."""
    if isinstance(src, (bytes, memoryview)):
        return src
    assert isinstance(src, tuple) and arena is not None, "a source in an arena needs the arena"
    offset, size = src
    return arena[offset : offset + size]

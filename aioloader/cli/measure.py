"""Loaders iterated for a time, as ``aioloader bench`` and its ``--tune`` sweep measure them:
samples after the first batch over the seconds after it (so start-up is reported apart, as
the first batch's time), and ``torch.utils.data.DataLoader`` on the same files and decode for
``--compare torch``. The main run's time counts from the start (``--seconds``: how long to
load); a ``--tune`` setting's from its first batch, so that each setting is measured for as
long, whatever its start-up took."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from aioloader.loader import Loader

__all__ = ["Measured", "TorchFiles", "batch_len", "compare_torch", "measure", "measure_loader"]


def measure(
    loader: Any, seconds: float, count: Any, label: str, *, after_first: bool = False
) -> tuple[int, float, float | None]:
    """Iterate ``loader`` epoch after epoch for ``seconds`` (from the start, or with
    ``after_first`` from the first batch), a progress bar on stderr: (samples after the
    first batch, seconds after it, seconds to the first batch); ``count(batch)`` says how
    many samples a batch holds."""
    from aioloader.observe.progressbar import _quiet_tqdm

    bar = _quiet_tqdm()(total=round(seconds), desc=label, unit="s", file=sys.stderr, leave=False)
    t0 = time.perf_counter()
    first: float | None = None
    samples = 0

    def elapsed(now: float) -> float:  # of the seconds to run
        return now - (first if after_first and first is not None else t0)

    try:
        while elapsed(time.perf_counter()) < seconds:
            for batch in loader:
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    samples += count(batch)
                ahead = min(round(seconds), int(elapsed(now))) - bar.n
                if ahead > 0 and first is not None:
                    bar.set_postfix_str(f"{samples / max(now - first, 1e-9):.0f} samples/s", refresh=False)
                    bar.update(ahead)  # tqdm redraws at most every 0.1 s
                if elapsed(now) >= seconds:
                    break
    finally:
        bar.close()
    end = time.perf_counter()
    return samples, (end - first) if first is not None else 0.0, (first - t0) if first is not None else None


def batch_len(batch: Any) -> int:
    """Samples in a DataLoader batch: the length of its first leaf."""
    while isinstance(batch, (tuple, list, dict)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch)


@dataclass
class Measured:
    """One loader's run: samples and bytes after the first batch, over ``seconds``."""

    samples: int
    seconds: float
    first_batch_s: float | None
    bytes_read: int
    stats: Any  # the LoaderStats at the end

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def measure_loader(
    loader: Loader, seconds: float, label: str, tracer: Any = None, *, after_first: bool = False
) -> Measured:
    """Open ``loader`` and iterate it for ``seconds`` (``after_first``: see :func:`measure`)
    with a progress bar (samples and bytes counted from its stats, so any batch structure is
    right)."""
    with loader:
        if tracer is not None:
            for meter in loader._counters.meters.values():
                meter.tracer = tracer
        marks: list[tuple[int, int]] = []  # (samples, bytes) at the first batch, then the last

        def count(batch: Any) -> int:  # samples since the previous batch, from the counters
            now = loader.stats
            if not marks:
                marks.append((now.samples, now.bytes_read))
            done = now.samples - marks[-1][0]
            marks.append((now.samples, now.bytes_read))
            return done

        samples, took, first = measure(loader, seconds, count, label, after_first=after_first)
        stats = loader.stats
    return Measured(samples, took, first, marks[-1][1] - marks[0][1] if marks else 0, stats)


class TorchFiles:
    """What a DataLoader user writes: read the file in ``__getitem__``, then decode."""

    def __init__(self, dataset: Any, decode: Any, options: dict[str, Any] | None) -> None:
        self.paths = list(dataset.paths)
        self.labels = None if dataset.labels is None else dataset.labels.tolist()
        self.decode, self.options = decode, options

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        from aioloader.read.urls import is_remote, options_for, scheme

        path = self.paths[i]
        if is_remote(path):
            import fsspec

            with fsspec.open(path, "rb", **options_for(self.options, scheme(path) or "")) as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        out = self.decode(data)
        return out if self.labels is None else (out, self.labels[i])


def compare_torch(
    dataset: Any, decode: Any, args: argparse.Namespace, workers: int, ours: float, options: Any
) -> dict[str, Any]:
    from torch.utils.data import DataLoader, Dataset

    peer: Any = DataLoader(
        cast("Dataset[Any]", TorchFiles(dataset, decode, options)),  # a map-style dataset
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
    )
    samples, seconds, first = measure(peer, args.seconds, batch_len, "DataLoader")
    del peer  # its persistent workers end with it
    gc.collect()
    rate = samples / seconds if seconds > 0 else 0.0
    return {
        "loader": f"torch.utils.data.DataLoader(num_workers={workers})",
        "samples_per_s": round(rate, 1),
        "first_batch_s": None if first is None else round(first, 3),
        "aioloader_ratio": round(ours / rate, 3) if rate > 0 else None,
    }

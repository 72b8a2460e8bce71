"""``aioloader bench PATH_OR_URL --cache memory|DIR``: the files through a loader with a
sample cache (``Loader(cache=aioloader.Cache(...))``) for two whole epochs, side by side:
epoch 1 reads the source and fills the cache, epoch 2 is served from it. For each: samples/s
over the epoch (from its first request of a batch to its last batch; the loader is started
before, so its start-up is left out of both), the cache's hits and misses in that epoch and
the bytes it holds at its end; then epoch 2's rate over epoch 1's. ``--max-side N`` keeps
images downscaled (``Cache(max_side=N)``), ``--cache-max-bytes`` bounds the cache. A disk
cache that earlier runs filled serves epoch 1 too: its hits say so. The loader's progress
bars are labelled as the report is: its epochs are set to 1 and 2 (``set_epoch``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from aioloader.cli.args import byte_size, positive_int

if TYPE_CHECKING:
    from aioloader.cache.settings import Cache
    from aioloader.loader import Loader

__all__ = [
    "CacheBenchResult",
    "EpochFigures",
    "add_cache_args",
    "cache_report",
    "format_cache_report",
    "make_cache",
    "run_cache_bench",
]

#: What bench's other options do that two whole epochs with a cache cannot.
_REFUSED = {"tune": "--tune", "trace": "--trace", "compare": "--compare"}


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """``--cache``, ``--max-side`` and ``--cache-max-bytes`` of the ``bench`` subcommand."""
    p.add_argument(
        "--cache",
        metavar="memory|DIR",
        default=None,
        help="run two whole epochs (--seconds does not apply) with a sample cache, in memory or in "
        "folder DIR, and print epoch 1 (filling it) against epoch 2 (served from it)",
    )
    p.add_argument(
        "--max-side",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --cache: keep images downscaled to N pixels on their longer side (Cache(max_side=N))",
    )
    p.add_argument(
        "--cache-max-bytes",
        type=byte_size,
        default=None,
        metavar="BYTES",
        help="with --cache: its bound, in bytes (suffixes K, M, G: powers of 1024; default: the "
        "Cache default, a quarter of the available memory or half the folder's free space)",
    )


def make_cache(args: argparse.Namespace) -> Cache:
    """The :class:`~aioloader.Cache` that ``--cache``, ``--max-side`` and
    ``--cache-max-bytes`` describe; ValueError for options that cannot go with them."""
    from aioloader.cache.settings import Cache

    if args.cache is None:
        raise ValueError("--max-side and --cache-max-bytes go with --cache memory|DIR")
    for name, flag in _REFUSED.items():
        if getattr(args, name, None):
            raise ValueError(f"--cache runs two whole epochs: it cannot go with {flag}")
    if getattr(args, "decode_on", "local") == "ray":
        raise ValueError("--cache measures the local decode workers: it cannot go with --decode-on ray")
    directory = None if args.cache == "memory" else args.cache
    return Cache(directory=directory, max_bytes=args.cache_max_bytes, max_side=args.max_side)


@dataclass
class EpochFigures:
    """One epoch of ``bench --cache``: its rate, and the cache as that epoch left it."""

    epoch: int  # 1 or 2
    role: str  # "filling" or "served"
    samples: int
    seconds: float
    samples_per_s: float
    mb_per_s: float  # bytes read from the source (and the cache) over the epoch
    hits: int
    misses: int
    bytes_held: int
    entries: int
    stored: int  # entries added in this epoch
    over_bound: int  # samples not kept in this epoch: the bound was reached


@dataclass
class CacheBenchResult:
    """What ``aioloader bench --cache`` measured: epoch 1 and epoch 2 side by side."""

    source: str
    files: int
    cache: dict[str, Any]
    settings: dict[str, Any]
    epoch1: EpochFigures
    epoch2: EpochFigures
    #: epoch 2's samples/s over epoch 1's.
    ratio: float
    #: epoch 2's hits and the bytes the cache held at its end (also in ``epoch2``).
    hits: int
    bytes_held: int


def _epoch(loader: Loader, number: int) -> EpochFigures:
    """Iterate one whole epoch of ``loader`` (started) and take its figures. The loader's
    epoch is ``number`` too (``set_epoch``), so its progress bar says what the report says:
    "epoch 1", then "epoch 2"."""
    before = loader.stats
    old = before.cache
    loader.set_epoch(number)
    t0 = time.perf_counter()
    for _ in loader:
        pass
    seconds = time.perf_counter() - t0
    after = loader.stats
    cache = after.cache
    assert cache is not None  # a loader with a cache counts it from its first read
    samples = after.samples - before.samples
    return EpochFigures(
        epoch=number,
        role="filling" if number == 1 else "served",
        samples=samples,
        seconds=round(seconds, 3),
        samples_per_s=round(samples / seconds, 1) if seconds > 0 else 0.0,
        mb_per_s=round((after.bytes_read - before.bytes_read) / seconds / 1e6, 2) if seconds > 0 else 0.0,
        hits=cache.epoch_hits,
        misses=cache.epoch_misses,
        bytes_held=cache.bytes_held,
        entries=cache.entries,
        stored=cache.stored - (old.stored if old is not None else 0),
        over_bound=cache.over_bound - (old.over_bound if old is not None else 0),
    )


def run_cache_bench(args: argparse.Namespace, cache: Cache, dataset: Any, decode: Any) -> CacheBenchResult:
    """Two whole epochs of ``dataset`` (the files ``args.source`` names) through a loader
    with ``cache`` (:func:`make_cache`) and ``decode``; the loader started before the first
    (its start-up in neither)."""
    from aioloader.loader import Loader

    options = json.loads(args.storage_options) if args.storage_options else None
    loader = Loader(
        dataset,
        batch_size=args.batch_size,
        decode=decode,
        num_workers=args.workers,
        io_concurrency=args.io_concurrency,
        storage_options=options,
        loader_process=args.loader_process,
        on_error=getattr(args, "on_error", "raise"),
        cache=cache,
        progress="always",  # the bar shows the cache's hit share and the bytes it holds
    )
    with loader:
        first = _epoch(loader, 1)
        second = _epoch(loader, 2)
        stats = loader.stats
        runtime = loader.runtime
    assert stats.cache is not None
    folder = cache.folder
    return CacheBenchResult(
        source=args.source,
        files=len(dataset),
        cache={
            "kind": "memory" if folder is None else "disk",
            "directory": None if folder is None else str(folder),
            "max_side": cache.max_side,
            "quality": cache.quality,
            "max_bytes": stats.cache.max_bytes,  # the bound the loader kept to
            "max_bytes_asked": cache.max_bytes,
        },
        settings={
            "decode": args.decode,
            "batch_size": args.batch_size,
            "num_workers": stats.num_workers,
            "io_concurrency": stats.io_concurrency,
            "num_workers_asked": "default" if args.workers is None else args.workers,
            "io_concurrency_asked": args.io_concurrency,
            "runtime": runtime,
            "loader_process": args.loader_process,
        },
        epoch1=first,
        epoch2=second,
        ratio=round(second.samples_per_s / first.samples_per_s, 3) if first.samples_per_s > 0 else 0.0,
        hits=second.hits,
        bytes_held=second.bytes_held,
    )


def format_cache_report(r: CacheBenchResult) -> str:
    """The human-readable side by side of the two epochs."""
    from aioloader.observe.progressbar import size_text

    c, s = r.cache, r.settings
    where = "in memory" if c["kind"] == "memory" else f"in {c['directory']}"
    shrink = f", max_side {c['max_side']} (JPEG quality {c['quality']})" if c["max_side"] else ""
    lines = [
        f"aioloader bench {r.source} --cache: {r.files} files, batch {s['batch_size']}, "
        f"{s['num_workers']} workers, io_concurrency {s['io_concurrency']}, decode {s['decode']}",
        f"  cache {where}, bound {size_text(c['max_bytes'])}{shrink}",
        "",
        f"  {'':<18} {'samples/s':>10} {'seconds':>8} {'hits':>8} {'misses':>8} {'held':>8} "
        f"{'over bound':>10}",
    ]
    for e in (r.epoch1, r.epoch2):
        lines.append(
            f"  {f'epoch {e.epoch} ({e.role})':<18} {e.samples_per_s:>10.0f} {e.seconds:>8.2f} {e.hits:>8} "
            f"{e.misses:>8} {size_text(e.bytes_held):>8} {e.over_bound:>10}"
        )
    lines += [
        "",
        f"  epoch 2 / epoch 1: {r.ratio:.2f}x ({r.hits} hits in epoch 2, {size_text(r.bytes_held)} held)",
    ]
    if r.epoch1.hits:
        lines.append(f"  epoch 1 found {r.epoch1.hits} entries an earlier run kept")
    if r.epoch2.misses:
        lines.append(
            f"  epoch 2 read {r.epoch2.misses} samples from the source: the bound was reached, or they "
            "have no identity the cache can key (see aioloader.Cache)"
        )
    return "\n".join(lines)


def cache_report(args: argparse.Namespace, cache: Cache, dataset: Any, decode: Any) -> str:
    """Run ``bench --cache`` (:func:`run_cache_bench`) and return what it prints: one JSON
    object with ``--json``, else the report."""
    result = run_cache_bench(args, cache, dataset, decode)
    return json.dumps(asdict(result)) if args.json else format_cache_report(result)

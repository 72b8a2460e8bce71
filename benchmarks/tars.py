"""Tar shards (WebDataset layout): aioloader over ``FileDataset.from_tars`` against
``webdataset.WebLoader`` (DataLoader workers) and ``wids`` (``ShardListDataset`` +
``ChunkedSampler`` in a DataLoader), side by side in the same run, all decoding with the
plain user function ``userfns.random_crop``. Asserts nothing about time.

The shards: ``--images`` JPEGs of 500x375 (``userfns.image_folder``) packed ``key.jpg`` +
``key.cls`` into ``--shards`` tars (made once, then reused). Read from local disk, and over
HTTP from the loopback file server of ``tests/servers.py`` with ``--latency`` ms added to
every request and, with ``--mbps``, each answer's body sent at most that fast (a far store
that serves one stream slowly; 0: no cap). Loaders, all with batch 64 and ``--workers`` processes:

- ``aioloader uniform``: ``shuffle=True``, each sample one ranged read, uniformly over every
  shard (the dataset made, and its index read from the local index cache, inside the timing);
- ``aioloader locality``: ``locality=Locality(1000)``, shards whole in a shuffled order;
- ``webdataset``: ``WebDataset(urls, shardshuffle=True).shuffle(1000)`` in ``WebLoader``;
- ``wids``: ``ShardListDataset`` (it downloads each shard whole into a local cache before
  reading a sample, emptied before each round) with ``ChunkedSampler(shuffle=True)``.

Reported per place (medians of ``--rounds`` interleaved rounds, one epoch each, start-up
included): samples/s and the ratio to ``webdataset``. Then, with ``--first-batch``: the time
to the first batch over ``--index-shards`` small shards on the HTTP server, unindexed (the
index pass) and with the index cached; and the index's size and a FileDataset's memory per
million samples.

    python benchmarks/tars.py [--images 20000] [--shards 20] [--where local,http] [--latency 20]
                              [--mbps 0,25] [--rounds 2] [--workers 2] [--first-batch] [--index-shards 1000]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from userfns import add_folder_args, batch_len, image_folder, random_crop

from aioloader import FileDataset, Loader, Locality
from aioloader.config import usable_cpus
from aioloader.read.tarsample import MemberNames

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import control, start_file_server

HERE = Path(__file__).resolve().parent


def make_shards(args: argparse.Namespace) -> Path:
    """``args.shards`` tars of the image folder's JPEGs (``key.jpg``, ``key.cls``), made once."""
    folder = image_folder(args)
    out = Path(args.data_dir) / f"tars_{args.images}img_{args.shards}shards"
    done = out / "DONE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in folder.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    per = -(-len(files) // args.shards)
    for s in range(args.shards):
        with tarfile.open(out / f"train-{s:06d}.tar", "w") as tar:
            for k, path in enumerate(files[s * per : (s + 1) * per]):
                key = f"{s:06d}_{k:06d}"
                for ext, data in (
                    ("jpg", path.read_bytes()),
                    ("cls", str(classes.index(path.parent.name)).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    done.touch()
    return out


def shard_urls(base: str, n: int) -> list[str]:
    return [f"{base}/train-{s:06d}.tar" for s in range(n)]


def wds_sample(sample: dict[str, Any]) -> tuple[Any, int]:
    return random_crop(sample["jpg"]), int(sample["cls"])


def wids_sample(sample: dict[str, Any]) -> tuple[Any, int]:
    def raw(v: Any) -> bytes:
        return v.getvalue() if hasattr(v, "getvalue") else v.read() if hasattr(v, "read") else bytes(v)

    return random_crop(raw(sample[".jpg"])), int(raw(sample[".cls"]))


def loaders(urls: list[str], args: argparse.Namespace, wids_cache: Path) -> dict[str, Callable[[], Any]]:
    import webdataset as wds
    import wids
    from torch.utils.data import DataLoader

    def uniform() -> Any:
        return Loader(
            FileDataset.from_tars(urls), batch_size=64, decode=random_crop, num_workers=args.workers
        )

    def locality() -> Any:
        ds = FileDataset.from_tars(urls)
        return Loader(
            ds, batch_size=64, decode=random_crop, num_workers=args.workers, locality=Locality(1000)
        )

    def webdataset() -> Any:
        # curl for http(s) URLs, as webdataset's gopen does; 20 shards over 2 workers.
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000).map(wds_sample)
        return wds.WebLoader(ds, batch_size=64, num_workers=args.workers)

    def wids_loader() -> Any:
        shutil.rmtree(wids_cache, ignore_errors=True)
        wids_cache.mkdir(parents=True)
        spec = [{"url": u, "nsamples": args.images // args.shards} for u in urls]
        ds = wids.ShardListDataset(spec, cache_dir=str(wids_cache), transformations=[wids_sample])
        sampler = wids.ChunkedSampler(ds, chunksize=1000, shuffle=True)
        return DataLoader(ds, batch_size=64, sampler=sampler, num_workers=args.workers)

    return {
        "aioloader uniform": uniform,
        "aioloader locality": locality,
        "webdataset": webdataset,
        "wids": wids_loader,
    }


def epoch(make: Callable[[], Any]) -> tuple[float, int]:
    """One epoch from construction: (seconds, samples)."""
    t0 = time.perf_counter()
    loader = make()
    n = 0
    try:
        for batch in loader:
            n += batch_len(batch)
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    return time.perf_counter() - t0, n


def throughput(args: argparse.Namespace, shards: Path) -> None:
    results: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        places: dict[str, tuple[list[str], Callable[[], None] | None]] = {}
        servers = []
        if "local" in args.where:
            places["local"] = (shard_urls(str(shards), args.shards), None)
        if "http" in args.where:
            server = start_file_server(shards)
            servers.append(server)
            for mbps in (float(m) for m in args.mbps.split(",")):
                # ETag and Last-Modified, as real servers send: the index is cached by them.
                settings = {"latency_ms": args.latency, "versions": True, "mbps": mbps}
                name = f"http +{args.latency} ms" + (f", {mbps:g} MB/s a stream" if mbps else "")
                places[name] = (
                    shard_urls(server.url, args.shards),
                    lambda u=server.url, c=settings: control(u, **c),
                )
        try:
            for place, (urls, setup) in places.items():
                if setup is not None:
                    setup()
                FileDataset.from_tars(urls)  # the index, cached before the rounds (see --first-batch)
                made = loaders(urls, args, Path(tmp) / "wids")
                for _ in range(args.rounds):
                    for name, make in made.items():
                        seconds, n = epoch(make)
                        results[(place, name)].append(n / seconds)
                        print(
                            f"{place:>14}  {name:<20} {n / seconds:8.0f} samples/s ({n} in {seconds:.1f} s)",
                            flush=True,
                        )
        finally:
            for server in servers:
                server.stop()
    print()
    print("| where | loader | samples/s | vs webdataset |")
    print("|---|---|---:|---:|")
    for place in dict.fromkeys(p for p, _ in results):
        base = statistics.median(results[(place, "webdataset")])
        for (p, name), rates in results.items():
            if p == place:
                rate = statistics.median(rates)
                print(f"| {place} | {name} | {rate:.0f} | {rate / base:.2f}x |")


def small_shards(root: Path, count: int, per: int) -> Path:
    """``count`` shards of ``per`` tiny members each (``key.jpg`` of 2 KB, ``key.cls``), made once."""
    out = root / f"tars_{count}x{per}"
    if (out / "DONE").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for s in range(count):
        with tarfile.open(out / f"train-{s:06d}.tar", "w") as tar:
            for k in range(per):
                for ext, data in (("jpg", os.urandom(2048)), ("cls", b"3")):
                    info = tarfile.TarInfo(f"{s:06d}_{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (out / "DONE").touch()
    return out


def first_batch(args: argparse.Namespace) -> None:
    shards = small_shards(Path(args.data_dir), args.index_shards, 20)
    server = start_file_server(shards)
    try:
        control(server.url, latency_ms=args.latency, versions=True)
        urls = shard_urls(server.url, args.index_shards)
        with tempfile.TemporaryDirectory() as cache:
            os.environ["AIOLOADER_CACHE"] = cache  # an empty index cache: the index pass
            for label in ("unindexed (the index pass)", "index cached"):
                t0 = time.perf_counter()
                ds = FileDataset.from_tars(urls)
                made = time.perf_counter() - t0
                with Loader(ds, batch_size=64, decode=None, num_workers=args.workers) as loader:
                    next(iter(loader))
                total = time.perf_counter() - t0
                print(
                    f"{args.index_shards} shards over HTTP +{args.latency} ms, {label}: dataset {made:.2f} s, first batch {total:.2f} s"
                )
    finally:
        server.stop()
    index_memory()


def index_memory() -> None:
    """A FileDataset of a million tar samples (1,000 shards of 1,000) as ``from_tars`` makes
    it, with each sample's member name (``000123_000456.jpg``, for errors): its memory."""
    entries: Iterator[tuple[str, int, int]] = (
        (f"s3://bucket/train-{s:06d}.tar", 1536 * k, 1024) for s in range(1000) for k in range(1000)
    )
    tracemalloc.start()
    ds = FileDataset(entries, labels=[k % 1000 for k in range(1_000_000)])
    names = MemberNames()
    for s in range(1000):
        names.add([f"{s:06d}_{k:06d}.jpg" for k in range(1000)])
    ds._names = names
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"FileDataset of {len(ds):,} tar samples: {size / 2**20:.1f} MiB ({size / len(ds):.0f} bytes a sample)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_args(p)
    p.set_defaults(images=20000)
    p.add_argument("--shards", type=int, default=20)
    p.add_argument("--where", default="local,http")
    p.add_argument("--latency", type=int, default=20, help="ms added to each HTTP request")
    p.add_argument(
        "--mbps",
        default="0",
        help="HTTP: each answer's MB/s, comma-separated (0: no cap; a far store's one stream)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=min(2, usable_cpus()))
    p.add_argument("--first-batch", action="store_true")
    p.add_argument("--index-shards", type=int, default=1000)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"# {time.strftime('%Y-%m-%d')}, {usable_cpus()} usable CPUs, torch {torch.__version__}")
    if args.first_batch:
        first_batch(args)
        return 0
    throughput(args, make_shards(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

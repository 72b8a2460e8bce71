"""``aioloader index SHARD...``: each tar shard's index written as a sidecar ``<shard>.idx``
(the format of :mod:`aioloader.read.tarscan`), which ``FileDataset.from_tars`` reads instead
of scanning the shard. Local shards get theirs beside them; for a URL it is written to
``--out`` (default: the current folder) as ``<name>.idx``, to upload beside the shard.
Shards in WebDataset's brace notation or a local glob, as ``from_tars`` takes them."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    index = sub.add_parser(
        "index",
        help="write the index of tar shards (WebDataset) as sidecar .idx files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    index.add_argument("shards", nargs="+", help="paths, URLs, globs or brace patterns")
    index.add_argument("--out", type=Path, default=Path("."), help="where URLs' indexes go (%(default)s)")


def main(args: argparse.Namespace) -> int:
    from aioloader.read.tarindex import scan_fresh
    from aioloader.read.tars import expand_shards
    from aioloader.read.tarscan import SCANS, write_index
    from aioloader.read.urls import is_remote, local_path, redact

    try:
        shards = expand_shards(args.shards)
    except ValueError as exc:
        print(f"aioloader index: {exc}")
        return 2

    def one(shard: str) -> str:
        t0 = time.perf_counter()
        (members,) = scan_fresh([shard])
        if is_remote(shard):
            target = args.out / (shard.rstrip("/").rsplit("/", 1)[-1] + ".idx")
        else:
            target = Path(local_path(shard) + ".idx")
        write_index(members, target)
        took = time.perf_counter() - t0
        return f"{redact(shard)}: {len(members)} members in {took:.2f} s -> {target}"

    failed = 0
    with ThreadPoolExecutor(SCANS) as pool:
        futures = [pool.submit(one, s) for s in shards]
        for shard, fut in zip(shards, futures, strict=True):
            try:
                print(fut.result(), flush=True)
            except (OSError, ValueError) as exc:
                failed += 1
                print(f"{redact(shard)}: {exc}", flush=True)
    return 1 if failed else 0

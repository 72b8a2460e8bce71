"""Indexing one tar shard each way it can be read (issue 44): seconds per shard.

One WebDataset shard of ``--samples`` samples (a ``--kb`` KB ``.jpg`` and a ``.cls`` each)
indexed (each member's name, data offset and size, and the ``.cls`` text) by the library's
own parser (``read/tarscan.scan``), fed four ways:

- **local, a seek past each member** (``from_tars``'s scan: ``tarscan.scan_local``): a
  512-byte read a header, the data skipped;
- **local, front to back**: the whole file read in 1 MiB reads, the data read and dropped;
- **HTTP, ``from_tars``'s scan** (``tarindex.scan_fresh``): ranged GETs of 8 MiB front to
  back, the next asked for ahead, the headers parsed as they arrive; a member over 1 MiB is
  passed over by a small GET where the next header is (so it is front to back for small
  members, a GET a member for large ones);
- **HTTP, a ranged GET a member**: one keep-alive connection, a 2 KB GET at each header
  (the header and a small member's data in one answer), one after another: where the next
  header is is known only from the last.

Local cases run with the file in the page cache ("warm") and evicted with
``posix_fadvise(DONTNEED)`` first ("cold"); HTTP ones against the loopback aiohttp server of
``tests/servers.py`` with each ``--latency`` (ms added to every request). Medians of
``--rounds``; asserts nothing.

    python benchmarks/tar_index.py [--samples 500] [--kb 85] [--latency 0,5,20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import io
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from aioloader.read import tarindex, tarscan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import control, start_file_server

#: Bytes a per-member GET asks for: a header and a small member's data (a label) at once.
ASK = 2048


def write_shard(path: Path, samples: int, kb: int) -> None:
    payload = os.urandom(kb * 1024)
    with tarfile.open(path, "w") as tar:
        for i in range(samples):
            for name, data in ((f"{i:06d}.jpg", payload[: kb * 1024 - i % 977]), (f"{i:06d}.cls", b"3")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def front_to_back(path: Path) -> int:
    with open(path, "rb", buffering=1 << 20) as f:
        return len(tarscan.scan(f, str(path)))


class RangedStream:
    """``tarscan.scan``'s stream over HTTP: a ranged GET at each place it reads (``ASK``
    bytes, later reads served from that answer while they fall in it); skips cost nothing."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
        self.path, self.pos, self.requests = parts.path, 0, 0
        self.buf, self.buf_at = b"", 0

    def read(self, n: int) -> bytes:
        if not (self.buf_at <= self.pos and self.pos + n <= self.buf_at + len(self.buf)):
            self.conn.request(
                "GET", self.path, headers={"Range": f"bytes={self.pos}-{self.pos + max(n, ASK) - 1}"}
            )
            answer = self.conn.getresponse()
            self.buf, self.buf_at = (answer.read() if answer.status == 206 else b""), self.pos
            self.requests += 1
        start = self.pos - self.buf_at
        out = self.buf[start : start + n]
        self.pos += len(out)
        return out

    def skip(self, n: int) -> int:
        self.pos += n
        return n


def per_member(url: str) -> int:
    stream = RangedStream(url)
    try:
        return len(tarscan.scan(stream, url, skip=stream.skip))
    finally:
        stream.conn.close()


def timed(fn: Callable[[], int], before: Callable[[], None] | None = None) -> tuple[float, int]:
    if before is not None:
        before()
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--kb", type=int, default=85)
    ap.add_argument("--latency", default="0,5,20", help="ms added to each HTTP request, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    latencies = [float(x) for x in args.latency.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard-000000.tar"
        write_shard(shard, args.samples, args.kb)
        size = shard.stat().st_size
        server = start_file_server(Path(tmp))
        url = f"{server.url}/{shard.name}"
        cases: dict[str, tuple[Callable[[], int], Callable[[], None] | None]] = {}
        for state, before in (("warm", None), ("cold", lambda: evict(shard))):
            cases[f"local {state}, a seek past each member"] = (
                lambda: len(tarscan.scan_local(str(shard))),
                before,
            )
            cases[f"local {state}, front to back"] = (lambda: front_to_back(shard), before)
        for ms in latencies:
            tag = f"+{ms:g} ms"
            cases[f"HTTP {tag}, from_tars's scan"] = (
                lambda: len(tarindex.scan_fresh([url])[0]),
                (lambda ms=ms: control(server.url, latency_ms=ms)),
            )
            cases[f"HTTP {tag}, a ranged GET a member"] = (
                lambda: per_member(url),
                (lambda ms=ms: control(server.url, latency_ms=ms)),
            )
        times: dict[str, list[float]] = {name: [] for name in cases}
        try:
            for _ in range(args.rounds):
                for name, (fn, before) in cases.items():
                    seconds, n = timed(fn, before)
                    assert n == 2 * args.samples, (name, n)
                    times[name].append(seconds)
                    print(f"{name:<42} {seconds:8.3f} s", flush=True)
        finally:
            server.stop()
    print(
        f"\n{args.samples} samples ({2 * args.samples} members), {size / 2**20:.1f} MiB; "
        f"{platform.node()}, {os.cpu_count()} CPUs, {datetime.date.today()}; medians of {args.rounds}"
    )
    print("| how | seconds a shard | members/s |\n|---|---:|---:|")
    for name, got in times.items():
        med = statistics.median(got)
        print(f"| {name} | {med:.3f} | {2 * args.samples / med:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

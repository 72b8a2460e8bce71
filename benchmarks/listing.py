"""Listing a bucket: ``FileDataset.from_folder("s3://...")`` on a moto bucket of 100,000
objects in 10 class prefixes, the prefixes listed concurrently (what ``from_folder`` does)
against one after another (``remote.list_folder(..., concurrent=False)``), each listing
paginated (1,000 keys a page). moto runs on 127.0.0.1 with the objects put through its own
backend (``tests/servers.py --moto-filled``); a loopback proxy in front of it adds L ms to
every request, as a real endpoint's round trip would. The servers' CPU seconds per listing
(moto's and the proxy's) show when moto itself is the limit: it scans the whole bucket for
every page it answers. Asserts nothing about time.

    python benchmarks/listing.py [--objects 100000] [--classes 10] [--latency 0,20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from remote import proc_cpu  # benchmarks/remote.py, beside this script

from aioloader import FileDataset
from aioloader.read.remote import list_folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import control, start_moto, start_proxy

BUCKET = "bench-listing"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=100_000, help="(%(default)s)")
    p.add_argument("--classes", type=int, default=10, help="(%(default)s)")
    p.add_argument("--latency", default="0,20", help="ms added per request (%(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="(%(default)s)")
    args = p.parse_args()
    latencies = [float(x) for x in args.latency.split(",")]
    print(f"# {shlex.join(['python', *sys.argv])}")
    t0 = time.perf_counter()
    moto = start_moto(filled=(BUCKET, args.objects, args.classes))
    proxy = start_proxy(moto.url)
    print(f"moto up with {args.objects:,} objects in {time.perf_counter() - t0:.1f} s")
    try:
        opts = {"endpoint_url": proxy.url, "key": "bench", "secret": "bench"}
        root = f"s3://{BUCKET}/train/"
        print(
            f"\n{'latency':>8} {'concurrent s':>13} {'one by one s':>13} {'ratio':>6} "
            f"{'server CPU s (conc, seq)':>25} {'objects':>8}"
        )
        for latency in latencies:
            control(proxy.url, latency_ms=latency)
            times: dict[bool, list[float]] = {True: [], False: []}
            cpu: dict[bool, list[float]] = {True: [], False: []}
            counts: set[int] = set()
            for _ in range(args.rounds):
                for concurrent in (True, False):  # interleaved
                    start, cpu0 = time.perf_counter(), proc_cpu(moto.pid) + proc_cpu(proxy.pid)
                    if concurrent:
                        n = len(FileDataset.from_folder(root, storage_options=opts))
                    else:
                        n = sum(len(v) for v in list_folder(root, opts, concurrent=False).values())
                    times[concurrent].append(time.perf_counter() - start)
                    cpu[concurrent].append(proc_cpu(moto.pid) + proc_cpu(proxy.pid) - cpu0)
                    counts.add(n)
            conc, seq = statistics.median(times[True]), statistics.median(times[False])
            used = f"{statistics.median(cpu[True]):.1f}, {statistics.median(cpu[False]):.1f}"
            print(
                f"{latency:>6.0f}ms {conc:>13.2f} {seq:>13.2f} {seq / conc:>5.2f}x {used:>25} {sorted(counts)!s:>8}"
            )
    finally:
        proxy.stop()
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

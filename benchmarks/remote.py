"""Remote storage: the same JPEGs served by each loopback server of ``tests/servers.py`` on
127.0.0.1 with L ms added to every request: over HTTP by the aiohttp file server, and over
S3 by moto's server behind the loopback proxy (which adds the latency). They are read by
aioloader on its event loop and by ``torch.utils.data.DataLoader`` whose Dataset calls
fsspec's blocking ``cat_file`` in ``__getitem__`` (what users write today), ``num_workers``
2 and 8. Both run the plain user function ``userfns.random_crop``. With ``--loader-process``
aioloader also runs in a loader process through each client (obstore, fsspec). Asserts
nothing about time.

Reported per latency and loader (medians of ``--rounds`` interleaved rounds, one epoch each,
start-up included): samples/s, ratio to DataLoader(num_workers=2), share of the decode limit
(usable cores x single-core decode rate, measured at the start), what the server alone can
serve (aioloader with ``decode=None``: bytes only), the trainer's process CPU per read, and
the server processes' own CPU per request (moto's and the proxy's together for S3), so a
server-bound run shows as one.

    python benchmarks/remote.py [--images 2000] [--store http,s3] [--latency 0,20,50]
                                [--rounds 3] [--workers 2] [--peer-workers 2,8] [--io 64]
                                [--io-slow 256] [--loader-process] [--faults]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from userfns import FsspecRead, PeerDataset, add_folder_args, batch_len, image_folder, random_crop, read_file

from aioloader import FileDataset, Loader
from aioloader.config import usable_cpus
from aioloader.read.backends import StorageBackend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import Server, control, s3_client, start_file_server, start_moto, start_proxy

HERE = Path(__file__).resolve().parent


def proc_cpu(pid: int) -> float:
    """User+sys CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_rate(paths: list[str], seconds: float = 3.0) -> float:
    data = [read_file(p) for p in paths[:200]]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        random_crop(data[n % len(data)])
        n += 1
    return n / (time.perf_counter() - start)


def run(make: Any, server_pids: list[int]) -> tuple[float, float, float, int]:
    """One epoch from construction: (seconds, trainer CPU seconds, server CPU seconds, samples)."""
    cpu0, srv0, t0 = time.process_time(), sum(map(proc_cpu, server_pids)), time.perf_counter()
    loader = make()
    n = 0
    try:
        for batch in loader:
            n += batch_len(batch)
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    seconds = time.perf_counter() - t0
    return seconds, time.process_time() - cpu0, sum(map(proc_cpu, server_pids)) - srv0, n


BUCKET = "bench-remote"


def fault_run(
    args: Any, store: str, control_url: str, urls: list[str], opts: dict[str, Any], lat: float
) -> str:
    """One epoch while 10% of objects answer 503 at first and (HTTP only: the proxy relays
    whole bodies) every 100th response is cut off mid-body: is every sample there once?"""
    resets = 100 if store == "http" else 0
    control(control_url, latency_ms=lat, fail_first=1, fail_share=0.1, reset_every=resets)
    t0 = time.perf_counter()
    numbered = FileDataset(urls, list(range(len(urls))))  # label = index: each sample once?
    loader = Loader(
        numbered,
        batch_size=args.batch_size,
        decode=random_crop,
        num_workers=args.workers,
        io_concurrency=args.io,
        storage_options=opts,
    )
    seen: list[int] = []
    with loader:
        for _, labels in loader:
            seen.extend(labels.tolist())
        stats = loader.stats
    seconds = time.perf_counter() - t0
    control(control_url, latency_ms=0, fail_first=0, fail_share=1.0, reset_every=0)
    cut = ", every 100th response cut off mid-body" if resets else ""
    return (
        f"Fault run, {store} (+{lat:g} ms; 10% of objects answer 503 at first{cut}): {len(seen)} samples "
        f"of {len(urls)} in {seconds:.1f} s ({len(seen) / seconds:.0f} samples/s), every sample exactly "
        f"once: {sorted(seen) == list(range(len(urls)))}; read retries {stats.read_retries}, "
        f"failures {stats.failures}"
    )


def serve(store: str, folder: Path, paths: list[str]) -> tuple[list[Server], str, list[str], dict[str, Any]]:
    """Start ``store``'s servers: (servers, the URL to control, the images' URLs, options)."""
    rel = [os.path.relpath(p, folder) for p in paths]
    if store == "http":
        server = start_file_server(folder)
        return [server], server.url, [f"{server.url}/{r}" for r in rel], {}
    moto = start_moto()
    opts: dict[str, Any] = {"endpoint_url": moto.url, "key": "bench", "secret": "bench"}
    client = s3_client(opts)
    client.create_bucket(Bucket=BUCKET)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: client.upload_file(str(folder / r), BUCKET, r), rel))
    proxy = start_proxy(moto.url)
    opts["endpoint_url"] = proxy.url
    return [moto, proxy], proxy.url, [f"s3://{BUCKET}/{r}" for r in rel], opts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_args(p)
    p.add_argument("--store", default="http,s3", help="servers: http, s3 (%(default)s)")
    p.add_argument("--latency", default="0,20,50", help="ms added to every request (%(default)s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="decode processes, both loaders (%(default)s)")
    p.add_argument("--peer-workers", default="2,8", help="DataLoader num_workers to compare (%(default)s)")
    p.add_argument("--io", type=int, default=64, help="aioloader io_concurrency below 50 ms (%(default)s)")
    p.add_argument("--io-slow", type=int, default=256, help="io_concurrency at 50 ms and above (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--loader-process",
        action="store_true",
        help="also aioloader with loader_process=True, through obstore and through fsspec",
    )
    p.add_argument(
        "--faults",
        action="store_true",
        help="then a fault run at the first latency: 10%% of objects answer 503 at first, 1%% of "
        "responses are cut off mid-body",
    )
    args = p.parse_args()

    folder = image_folder(args)
    local = FileDataset.from_folder(folder)
    cores = usable_cpus()
    rate = decode_rate(list(local.paths))
    limit = cores * rate
    print(f"# decode limit {cores} x {rate:.0f} = {limit:.0f} samples/s", flush=True)
    latencies = [float(x) for x in args.latency.split(",") if x.strip()]
    peers = [int(x) for x in args.peer_workers.split(",") if x.strip()]
    stores = [x.strip() for x in args.store.split(",") if x.strip()]
    results: dict[tuple[str, float, str], list[tuple[float, float, float, int]]] = defaultdict(list)
    fault_lines: list[str] = []
    for store in stores:
        servers, control_url, urls, opts = serve(store, folder, list(local.paths))
        pids = [s.pid for s in servers]
        try:
            files = FileDataset(urls, local.labels, classes=local.classes)

            def aio(
                io: int,
                decode: Any,
                process: bool = False,
                backend: StorageBackend = "auto",
                files: Any = files,
            ) -> Any:
                return lambda: Loader(
                    files,
                    batch_size=args.batch_size,
                    decode=decode,
                    num_workers=args.workers,
                    io_concurrency=io,
                    loader_process=process,
                    storage_options=opts,  # noqa: B023 - called before the loop moves on
                    storage_backend=backend,
                )

            def peer(workers: int, files: Any = files) -> Any:
                return lambda: DataLoader(
                    PeerDataset(files, random_crop, FsspecRead(store, **opts)),  # noqa: B023
                    batch_size=args.batch_size,
                    shuffle=True,
                    num_workers=workers,
                    persistent_workers=False,
                )

            for r in range(args.rounds):
                for lat in latencies:
                    control(control_url, latency_ms=lat)
                    io = args.io_slow if lat >= 50 else args.io
                    runs = [(f"DataLoader(num_workers={w})", peer(w)) for w in peers]
                    runs += [(f"aioloader (io_concurrency={io})", aio(io, random_crop))]
                    if args.loader_process:
                        for backend in ("obstore", "fsspec"):
                            runs += [
                                (
                                    f"aioloader, loader process, {backend} (io_concurrency={io})",
                                    aio(io, random_crop, True, backend),
                                )
                            ]
                    runs += [("server alone (aioloader, decode=None)", aio(io, None))]
                    for name, make in runs:
                        res = run(make, pids)
                        results[store, lat, name].append(res)
                        print(
                            f"# {store} round {r + 1} +{lat:g} ms {name}: {res[3] / res[0]:.0f} samples/s",
                            flush=True,
                        )
            if args.faults:
                fault_lines.append(fault_run(args, store, control_url, urls, opts, latencies[0]))
        finally:
            for server in servers:
                server.stop()

    med = statistics.median
    print()
    print(f"Command: `{shlex.join([os.path.basename(sys.executable), *sys.argv])}`")
    print()
    print(
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs ({cores} usable); "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}"
    )
    print(
        f"- {args.images} JPEGs 500x375 served by tests/servers.py on 127.0.0.1 (http: the aiohttp file "
        f"server; s3: moto behind the aiohttp proxy) with +L ms per request; batch {args.batch_size}; decode userfns.random_crop in {args.workers} processes "
        f"(aioloader) or num_workers (DataLoader, fsspec cat_file in __getitem__); decode limit "
        f"{limit:.0f} samples/s; medians of {args.rounds} rounds, one epoch each, start-up included"
    )
    print()
    print(
        f"| store | +ms | loader | samples/s | vs DataLoader({peers[0]}) | share of decode limit "
        "| share of server alone | trainer CPU ms/read | server CPU ms/request |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for store in stores:
        for lat in latencies:
            names = [n for (st, la, n) in results if (st, la) == (store, lat)]
            base = med(x[3] / x[0] for x in results[store, lat, f"DataLoader(num_workers={peers[0]})"])
            alone = med(x[3] / x[0] for x in results[store, lat, names[-1]])
            for name in names:
                rs = results[store, lat, name]
                sps = med(x[3] / x[0] for x in rs)
                print(
                    f"| {store} | {lat:g} | {name} | {sps:.0f} | {sps / base:.2f}x | {sps / limit:.0%} "
                    f"| {sps / alone:.0%} | {med(x[1] / x[3] for x in rs) * 1e3:.3f} "
                    f"| {med(x[2] / x[3] for x in rs) * 1e3:.3f} |"
                )
    for line in fault_lines:
        print()
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

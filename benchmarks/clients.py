"""The remote clients alone, no loader around them: fsspec's asynchronous filesystem
(aiohttp) against obstore (Rust, tokio threads), each awaiting N reads in flight on one
uvloop loop, of the same 2,000 JPEGs served by ``tests/servers.py``'s aiohttp file server on
127.0.0.1 with L ms per request. Reported: reads/s, and this process's CPU per read (all
its threads, tokio's included), the floor under what any loader built on that client costs
its process per read. Medians of ``--rounds`` interleaved rounds. Asserts nothing about time.

    python benchmarks/clients.py [--images 2000] [--cases 20:256,50:1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from userfns import add_folder_args, image_folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import control, start_file_server

Cat = Callable[[str], Awaitable[object]]


async def bounded(cat: Cat, names: list[str], n: int) -> None:
    sem = asyncio.Semaphore(n)

    async def one(name: str) -> None:
        async with sem:
            await cat(name)

    await asyncio.gather(*(one(x) for x in names))


async def with_fsspec(url: str, names: list[str], n: int) -> None:
    import aiohttp
    import fsspec

    connector = aiohttp.TCPConnector(limit=n, limit_per_host=n)
    fs = fsspec.filesystem(
        "http", asynchronous=True, skip_instance_cache=True, client_kwargs={"connector": connector}
    )
    await fs.set_session()
    try:
        await bounded(lambda name: fs._cat_file(f"{url}/{name}"), names, n)
    finally:
        await fs._session.close()


async def with_obstore(url: str, names: list[str], n: int) -> None:
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options={"allow_http": True, "pool_max_idle_per_host": str(n)})

    async def cat(name: str) -> object:
        got = await obstore.get_async(store, name)
        return await got.bytes_async()

    await bounded(cat, names, n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_args(p)
    p.add_argument("--cases", default="20:256,50:1000", help="latency_ms:in_flight pairs (%(default)s)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    folder = image_folder(args)
    names = sorted(str(q.relative_to(folder)) for q in folder.rglob("*.jpg"))
    cases = [(float(a), int(b)) for a, b in (c.split(":") for c in args.cases.split(","))]
    clients = {"fsspec (aiohttp)": with_fsspec, "obstore": with_obstore}
    results: dict[tuple[float, int, str], list[tuple[float, float]]] = {}
    server = start_file_server(folder)
    try:
        for _ in range(args.rounds):
            for lat, n in cases:
                control(server.url, latency_ms=lat)
                for name, client in clients.items():
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    uvloop.run(client(server.url, names, n))
                    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    results.setdefault((lat, n, name), []).append((len(names) / seconds, cpu / len(names)))
    finally:
        server.stop()
    print(
        f"Command: `{shlex.join(['python', *sys.argv])}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print()
    print("| +ms | in flight | client | reads/s | CPU ms/read (whole process) |")
    print("|---:|---:|---|---:|---:|")
    for (lat, n, name), rs in results.items():
        rate = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        print(f"| {lat:g} | {n} | {name} | {rate:.0f} | {cpu * 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Micro-benchmark: cost of handing one item from a producer thread to a consumer.

Compares aioloader's Handoff (sync ``get`` and async ``aget``) with ``queue.Queue`` and with
a ``run_coroutine_threadsafe`` round trip per item (what a portal call per batch costs).
Prints microseconds per item; asserts nothing.

    python benchmarks/handoff.py [--items 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import queue
import threading
import time

from aioloader.run.handoff import Closed, Handoff


def bench_handoff_sync(n: int) -> float:
    h: Handoff[int] = Handoff(1)

    def produce() -> None:
        for i in range(n):
            h.put(i)
        h.close()

    t = threading.Thread(target=produce)
    start = time.perf_counter()
    t.start()
    try:
        while True:
            h.get()
    except Closed:
        pass
    t.join()
    return (time.perf_counter() - start) / n


def bench_handoff_async(n: int) -> float:
    h: Handoff[int] = Handoff(1)

    def produce() -> None:
        for i in range(n):
            h.put(i)
        h.close()

    async def consume() -> float:
        t = threading.Thread(target=produce)
        start = time.perf_counter()
        t.start()
        try:
            while True:
                await h.aget()
        except Closed:
            pass
        t.join()
        return (time.perf_counter() - start) / n

    return asyncio.run(consume())


def bench_queue(n: int) -> float:
    q: queue.Queue[int | None] = queue.Queue(1)

    def produce() -> None:
        for i in range(n):
            q.put(i)
        q.put(None)

    t = threading.Thread(target=produce)
    start = time.perf_counter()
    t.start()
    while q.get() is not None:
        pass
    t.join()
    return (time.perf_counter() - start) / n


def bench_portal(n: int) -> float:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever)
    t.start()
    q: asyncio.Queue[int] = asyncio.Queue(1)

    async def fill() -> None:
        for i in range(n):
            await q.put(i)

    asyncio.run_coroutine_threadsafe(fill(), loop)
    start = time.perf_counter()
    for _ in range(n):
        asyncio.run_coroutine_threadsafe(q.get(), loop).result()
    elapsed = (time.perf_counter() - start) / n
    loop.call_soon_threadsafe(loop.stop)
    t.join()
    loop.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "Handoff.get (sync consumer)": bench_handoff_sync,
        "Handoff.aget (async consumer)": bench_handoff_async,
        "queue.Queue(1)": bench_queue,
        "run_coroutine_threadsafe round trip": bench_portal,
    }
    print(
        f"# hand-off cost, {args.items} items, median of {args.rounds}; {platform.node()} python {platform.python_version()}"
    )
    print("| hand-off | us per item |")
    print("| --- | ---: |")
    for name, fn in cases.items():
        times = sorted(fn(args.items) for _ in range(args.rounds))
        print(f"| {name} | {times[len(times) // 2] * 1e6:.1f} |")


if __name__ == "__main__":
    main()

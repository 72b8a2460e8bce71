"""Micro-benchmark: the cost of shipping ~100 KB of file bytes to a decode worker and
~150 KB of decoded pixels back, per sample, the ways the engine could do it.

Measures the parent's CPU time per sample (``time.process_time``: every thread of the
parent, i.e. what it takes away from the decode workers on a small machine) and wall time
per sample, with 2 workers that do no decoding (so only transport is timed). Asserts
nothing.

    python benchmarks/ipc.py [--samples 4000] [--chunk 16]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from aioloader.decode.pool import mp_context

IN_BYTES = 110_000
OUT_SHAPE = (3, 224, 224)
OUT_BYTES = int(np.prod(OUT_SHAPE))

_attached: dict[str, Any] = {}


def _attach(name: str) -> memoryview:
    m = _attached.get(name)
    if m is None:
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        import mmap

        m = _attached[name] = mmap.mmap(fd, 0)
        os.close(fd)
    return memoryview(m)


def per_sample_pipe(data: bytes) -> np.ndarray:
    """Bytes in by pickle, pixels out by pickle."""
    return np.full(OUT_SHAPE, data[0], dtype=np.uint8)


def chunk_pipe(items: list[bytes]) -> list[np.ndarray]:
    return [np.full(OUT_SHAPE, d[0], dtype=np.uint8) for d in items]


def chunk_shm(name: str, in_offsets: list[tuple[int, int]], out_base: int, first: int) -> list[bool]:
    """Bytes in from shared memory, pixels written into shared memory; only offsets cross."""
    buf = _attach(name)
    out = []
    for k, (off, size) in enumerate(in_offsets):
        data = buf[off : off + size]
        dest = np.frombuffer(buf, dtype=np.uint8, count=OUT_BYTES, offset=out_base + (first + k) * OUT_BYTES)
        dest[:] = data[0]
        out.append(True)
    return out


def measure(fn: Any, n: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=16)
    args = parser.parse_args()
    n, c = args.samples, args.chunk
    payload = os.urandom(IN_BYTES)
    with ProcessPoolExecutor(2, mp_context=mp_context()) as pool:
        list(pool.map(per_sample_pipe, [payload] * 8))  # warm

        def a() -> None:
            futs = [pool.submit(per_sample_pipe, payload) for _ in range(n)]
            for f in futs:
                f.result()

        def b() -> None:
            futs = [pool.submit(chunk_pipe, [payload] * c) for _ in range(n // c)]
            for f in futs:
                f.result()

        shm = shared_memory.SharedMemory(create=True, size=c * 8 * (IN_BYTES + OUT_BYTES))
        try:
            view = shm.buf
            slots = 8  # chunks in the arena at once
            in_base, out_base = 0, slots * c * IN_BYTES
            for s in range(slots * c):
                view[in_base + s * IN_BYTES : in_base + (s + 1) * IN_BYTES] = payload

            def d() -> None:
                futs = []
                for k in range(n // c):
                    slot = (k % slots) * c
                    offs = [(in_base + (slot + j) * IN_BYTES, IN_BYTES) for j in range(c)]
                    futs.append(pool.submit(chunk_shm, shm.name, offs, out_base, slot))
                for f in futs:
                    f.result()

            rows = [
                ("one task per sample, bytes and pixels pickled", a),
                (f"chunks of {c}, bytes and pixels pickled", b),
                (f"chunks of {c}, bytes and pixels in shared memory", d),
            ]
            print(
                f"# IPC cost per sample, {n} samples, 2 workers, {IN_BYTES // 1000} KB in / {OUT_BYTES // 1000} KB out"
            )
            print("| transport | parent CPU us/sample | wall us/sample |")
            print("| --- | ---: | ---: |")
            for name, fn in rows:
                cpu, wall = measure(fn, n)
                print(f"| {name} | {cpu:.0f} | {wall:.0f} |")
            del view
        finally:
            shm.close()
            shm.unlink()


if __name__ == "__main__":
    main()

"""Consume aioloader from async code: ``async with`` + ``async for``, with other coroutines
running on the same event loop while batches load (the loader never blocks the loop).

    python examples/async_train.py
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aioloader
from aioloader.synthetic import make_image_folder


async def heartbeat(stop: asyncio.Event) -> float:
    """Ticks every 10 ms and returns the longest gap between ticks in seconds: a loop blocked
    by the loader would show here as a gap as long as the block."""
    longest, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return longest


async def consume(root: Path) -> None:
    dataset = aioloader.FileDataset.from_folder(root)
    stop = asyncio.Event()
    beat = asyncio.create_task(heartbeat(stop))
    start = time.perf_counter()
    samples = 0
    async with aioloader.Loader(dataset, batch_size=16, decode=aioloader.ImageDecoder(96)) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            async for _images, labels in loader:
                samples += len(labels)
                await asyncio.sleep(0.005)  # stands in for an async train step or a request
    stop.set()
    longest = await beat
    elapsed = time.perf_counter() - start
    print(f"{samples} samples in {elapsed:.2f} s; longest event-loop stall {longest * 1000:.0f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(Path(tmp) / "train", num_images=128, num_classes=4, size=(128, 96))
        asyncio.run(consume(root))


if __name__ == "__main__":
    main()

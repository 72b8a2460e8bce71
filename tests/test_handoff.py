"""The bridge -> trainer hand-off, tested directly with real threads and event loops."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aioloader.run.handoff import Closed, Handoff


def test_fifo_across_threads() -> None:
    h: Handoff[int] = Handoff(2)
    got: list[int] = []

    def consume() -> None:
        try:
            while True:
                got.append(h.get())
        except Closed:
            pass

    t = threading.Thread(target=consume)
    t.start()
    for i in range(1000):
        assert h.put(i)
    h.close()
    t.join(10)
    assert got == list(range(1000))


def test_put_blocks_while_full_and_close_releases_it() -> None:
    h: Handoff[int] = Handoff(1)
    assert h.put(1)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(h.put(2)))
    t.start()
    time.sleep(0.1)
    assert t.is_alive() and result == []  # blocked: capacity 1
    h.close()
    t.join(5)
    assert result == [False]  # dropped, not queued
    assert h.get() == 1  # what was queued before close can still be taken
    with pytest.raises(Closed):
        h.get()


def test_get_wakes_when_closed() -> None:
    h: Handoff[int] = Handoff(1)
    threading.Timer(0.1, h.close).start()
    with pytest.raises(Closed):
        h.get()


@pytest.mark.asyncio
async def test_aget_from_a_producer_thread() -> None:
    h: Handoff[int] = Handoff(1)

    def produce() -> None:
        for i in range(200):
            h.put(i)
        h.close()

    t = threading.Thread(target=produce)
    t.start()
    got = []
    try:
        while True:
            got.append(await h.aget())
    except Closed:
        pass
    t.join(5)
    assert got == list(range(200))


@pytest.mark.asyncio
async def test_aget_cancelled_leaves_no_waiter() -> None:
    h: Handoff[int] = Handoff(1)
    task = asyncio.ensure_future(h.aget())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not h._waiters
    h.put(5)
    assert await h.aget() == 5

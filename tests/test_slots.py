"""OrderedSlots: decode slots go to the earliest chunk of the epoch, not the first to ask."""

from __future__ import annotations

import asyncio

import pytest

from aioloader.memory.slots import OrderedSlots

pytestmark = pytest.mark.asyncio


async def test_closed_slots_open_in_key_order_not_arrival_order() -> None:
    slots = OrderedSlots(2, opened=False)
    granted: list[int] = []

    async def chunk(k: int) -> None:
        async with slots.slot((k, 0)):
            granted.append(k)
            await asyncio.sleep(0.01)

    tasks = [asyncio.ensure_future(chunk(k)) for k in (5, 3, 9, 0, 1)]  # reads finish out of order
    await asyncio.sleep(0.01)
    assert granted == []  # nothing runs before the pool has started
    slots.open()
    await asyncio.gather(*tasks)
    assert granted == [0, 1, 3, 5, 9]


async def test_a_freed_slot_goes_to_the_smallest_waiting_key() -> None:
    slots = OrderedSlots(1)
    await slots.acquire((7, 0))  # a slow sample ahead holds the only slot
    order: list[tuple[int, int]] = []

    async def waiter(key: tuple[int, int]) -> None:
        await slots.acquire(key)
        order.append(key)
        slots.release()

    tasks = [asyncio.ensure_future(waiter(k)) for k in [(8, 0), (2, 4), (2, 1)]]
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*tasks)
    assert order == [(2, 1), (2, 4), (8, 0)]


async def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    slots = OrderedSlots(1)
    await slots.acquire((0,))
    first = asyncio.ensure_future(slots.acquire((1,)))
    second = asyncio.ensure_future(slots.acquire((2,)))
    await asyncio.sleep(0)
    first.cancel()
    slots.release()
    await asyncio.wait_for(second, timeout=5)  # granted despite the cancelled one ahead of it
    with pytest.raises(asyncio.CancelledError):
        await first
    slots.release()
    await asyncio.wait_for(slots.acquire((3,)), timeout=5)  # and no slot was lost


async def test_a_raised_limit_wakes_waiters_at_once() -> None:
    slots = OrderedSlots(1)
    await slots.acquire((0,))
    waiters = [asyncio.ensure_future(slots.acquire((k,))) for k in (1, 2, 3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    slots.set_limit(3)  # two more slots: the two smallest keys get them
    await asyncio.sleep(0)
    assert [w.done() for w in waiters] == [True, True, False]
    assert slots.held == 3
    slots.release()
    await asyncio.wait_for(waiters[2], timeout=5)


async def test_a_lowered_limit_takes_effect_as_held_slots_come_back() -> None:
    slots = OrderedSlots(4)
    for k in range(4):
        await slots.acquire((k,))
    slots.set_limit(2)  # nothing is taken back from the four holders
    assert slots.held == 4
    late = asyncio.ensure_future(slots.acquire((9,)))
    slots.release()
    slots.release()  # two came back: exactly the limit is held, nobody new gets in
    await asyncio.sleep(0)
    assert not late.done() and slots.held == 2
    slots.release()  # under the limit now: the waiter gets the freed slot
    await asyncio.wait_for(late, timeout=5)
    assert slots.held == 2


async def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit=0 must be at least 1"):
        OrderedSlots(2).set_limit(0)


async def test_a_closed_pool_opens_with_the_limit_set_meanwhile() -> None:
    slots = OrderedSlots(2, opened=False)
    slots.set_limit(3)
    got = [asyncio.ensure_future(slots.acquire((k,))) for k in range(4)]
    await asyncio.sleep(0)
    slots.open()
    await asyncio.sleep(0)
    assert [g.done() for g in got] == [True, True, True, False]
    for _ in range(3):
        slots.release()
    await asyncio.wait_for(got[3], timeout=5)


async def test_an_epochs_opening_lets_later_batches_on_in_epoch_order() -> None:
    """The engine's Opening (aioloader/engine/opening.py): a later batch's chunk, its files
    read, waits until the first batch's files are all read and its first sample taught the
    layout; then the waiters go on smallest key first, and ask for open decode slots in
    that order (the slots grant at once while free: the order they ask in is the order)."""
    from aioloader.engine.opening import Opening

    opening = Opening(need_layout=True)
    opening.cut(2)  # the first batch's two chunks
    slots = OrderedSlots(2)
    granted: list[int] = []

    async def later(k: int) -> None:
        await opening.wait((k, 0))
        async with slots.slot((k, 0)):
            granted.append(k)
            await asyncio.sleep(0.01)

    tasks = [asyncio.ensure_future(later(k)) for k in (7, 2, 5, 1)]  # reads finished out of order
    await asyncio.sleep(0)
    opening.chunk_read()
    opening.chunk_read()  # every file of the first batch read, its layout still unknown
    await asyncio.sleep(0.005)
    assert granted == [] and not opening.is_open
    opening.layout_learned()
    assert opening.is_open
    await asyncio.gather(*tasks)
    assert granted == [1, 2, 5, 7]
    await opening.wait((0, 0))  # once open, never waits


async def test_an_opening_opens_when_the_first_batch_ends_whatever_it_learned() -> None:
    from aioloader.engine.opening import Opening

    opening = Opening(need_layout=True)
    opening.cut(1)
    waiter = asyncio.ensure_future(opening.wait((3, 0)))
    opening.chunk_read()
    await asyncio.sleep(0)
    assert not waiter.done()  # every sample of the first batch failed: no layout to learn
    opening.batch_done()
    await asyncio.wait_for(waiter, 1)

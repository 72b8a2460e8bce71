"""The decode thread (aioloader/run/decodeahead.py): the device decode's first half a batch
ahead of the bridge, in order, bounded, cancelled with its run, its errors in their place; and
in a real loader, batch k+1's decode under way while the bridge still finishes batch k."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioloader
from aioloader.base.items import Batch, End, Failure, Item
from aioloader.decode.batchdec import PillowBatchDecoder
from aioloader.decode.ondevice import bridgeside
from aioloader.run.decodeahead import DecodeAhead
from aioloader.run.handoff import Handoff
from aioloader.synthetic import make_image_folder


class FakeRun:
    """A run of ``items`` then End; counts what was pulled; blocks when ``stall`` is set."""

    def __init__(self, n: int, stall: bool = False) -> None:
        self.items: list[Item] = [Batch(i, f"b{i}", 1) for i in range(n)] + [End()]
        self.pulled = 0
        self.handoff: Handoff[Item] = Handoff(1)
        self.cancelled = False
        self._wake = threading.Event()
        self._stall = stall

    def next_ready(self) -> Item | None:
        if self._stall:
            self._wake.wait(30)
        if self.cancelled or self.pulled == len(self.items):
            return None
        self.pulled += 1
        return self.items[self.pulled - 1]

    def cancel(self) -> None:
        self.cancelled = True
        self._wake.set()


def begun(item: Item) -> Item:
    if isinstance(item, Batch):
        item.value = ("begun", item.value, threading.current_thread().name)
    return item


def test_items_pass_in_order_through_begin_on_the_decode_thread() -> None:
    run = FakeRun(5)
    ahead = DecodeAhead(run, begun, lambda: None)
    got = []
    while (item := ahead.next_ready()) is not None:
        got.append(item)
    ahead.close(10)
    assert [b.value for b in got[:-1]] == [("begun", f"b{i}", "aioloader-decode") for i in range(5)]
    assert isinstance(got[-1], End)
    assert not ahead._thread.is_alive()


def test_it_runs_at_most_depth_ahead() -> None:
    run = FakeRun(10)
    ahead = DecodeAhead(run, begun, lambda: None, depth=1)
    first = ahead.next_ready()
    assert isinstance(first, Batch)
    for _ in range(200):  # let the thread run as far as it may
        if run.pulled >= 3:
            break
        threading.Event().wait(0.01)
    assert run.pulled == 3  # one taken, one queued, one being begun (blocked on the queue)
    ahead.cancel()
    ahead.close(10)
    assert not ahead._thread.is_alive()


def test_cancel_wakes_the_thread_and_the_bridge() -> None:
    run = FakeRun(3, stall=True)
    ahead = DecodeAhead(run, begun, lambda: None)
    waiter = threading.Thread(target=lambda: box.append(ahead.next_ready()))
    box: list[Any] = []
    waiter.start()
    ahead.cancel()
    waiter.join(10)
    ahead.close(10)
    assert box == [None] and not ahead._thread.is_alive() and run.cancelled


def test_an_error_of_begin_is_the_runs_failure_in_its_place() -> None:
    def bad(item: Item) -> Item:
        if isinstance(item, Batch) and item.index == 1:
            raise RuntimeError("boom")
        return item

    ahead = DecodeAhead(FakeRun(3), bad, lambda: None)
    first, second, third = ahead.next_ready(), ahead.next_ready(), ahead.next_ready()
    ahead.close(10)
    assert isinstance(first, Batch) and first.index == 0
    assert isinstance(second, Failure) and "boom" in str(second.error)
    assert third is None


@pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])
def test_the_next_batch_decodes_while_the_bridge_finishes_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loader_process: bool
) -> None:
    """The bridge's resize of batch 0 waits until batch 1's decode has begun: without the
    decode thread it would wait for ever (here: 60 s, then the test fails)."""
    root = make_image_folder(tmp_path, num_images=24, num_classes=2, size=(64, 48))
    decoded: list[int] = []
    second = threading.Event()
    real_decode = PillowBatchDecoder.decode
    real_resize = bridgeside.resize_batch

    def decode(self: PillowBatchDecoder, datas: Any, *args: Any) -> list[int]:
        decoded.append(len(datas))
        if len(decoded) == 2:
            second.set()
        return real_decode(self, datas, *args)

    def resize(*args: Any, **kw: Any) -> Any:
        if not second.is_set():
            assert second.wait(60), "batch 1 was not being decoded while batch 0 was finished"
        return real_resize(*args, **kw)

    monkeypatch.setattr(PillowBatchDecoder, "decode", decode)
    monkeypatch.setattr(bridgeside, "resize_batch", resize)
    dec = aioloader.ImageDecoder(32, device="cpu")
    loader = aioloader.Loader(
        aioloader.FileDataset.from_folder(root),
        batch_size=8,
        decode=dec,
        num_workers=1,
        device="cpu",
        loader_process=loader_process,
    )
    with loader:
        images = [x for x, _ in loader]
    assert len(images) == 3 and len(decoded) == 3 and all(n > 0 for n in decoded)
    assert np.all([tuple(x.shape) == (8, 3, 32, 32) for x in images])

"""The messages between processes, without processes: each one round-trips through pickle
(as it crosses its pipe) and is dispatched by its type, never by a position.

The loader process's handlers run on stand-ins for their host (``SimpleNamespace``): what they
do with each message is checked, not how the pipeline runs (``test_loader_process.py``).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import multiprocessing
import os
import pickle
from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from aioloader.base.items import END, Batch, Failure
from aioloader.decode.chunk import Chunk, Shrink
from aioloader.errors import LoaderError
from aioloader.memory.segments import SegmentHandle
from aioloader.observe.cachestats import CacheStats
from aioloader.observe.stats import Counters, LoaderSide
from aioloader.observe.wheredecoded import DeviceSide
from aioloader.plan.resume import ResumePoint
from aioloader.procs import zygote
from aioloader.read import readmsgs
from aioloader.read.readproc import PARTS
from aioloader.run import messages as m
from aioloader.run import wire
from aioloader.run.loaderproc import Host
from aioloader.run.procruntime import PipeRun, _Channel

HANDLE = SegmentHandle("aioloader-1-2-ab", "/proc/1/fd/3", 5, 6)


def _again(value: Any) -> Any:
    return pickle.loads(pickle.dumps(value, protocol=5))


def _counts() -> LoaderSide:
    counters = Counters()
    counters.device_loader_side(3, {"not a JPEG": 1}, 0.25, "why")
    return counters.loader_side()


# -- trainer <-> loader process (aioloader/run/messages.py) ------------------------------------------


def test_each_control_and_report_round_trips() -> None:
    counts = _counts()
    resume = ResumePoint(epoch=2, start=16, done=frozenset({17}), samples=64)
    values = [
        m.StartRun(3, 2, resume, m.Restore({"corrupt": 2}, 100)),
        m.StartRun(1, 0, None, None),
        m.CancelRun(3),
        m.Close(),
        m.Ready(None),
        m.Ready(wire.pack_error(LoaderError("no"))),
        m.BatchMsg(3, 5, 4, (5,), "*", [1, "a"], [HANDLE], counts),
        m.EndMsg(3, counts),
        m.FailMsg(3, b"packed", counts),
        m.Closed(CacheStats(hits=3)),
        m.Closed(None),
    ]
    for value in values:
        again = _again(value)
        assert type(again) is type(value) and again == value
    assert isinstance(counts.device, DeviceSide) and _again(counts) == counts


def test_a_log_record_crosses_as_a_log_message() -> None:
    record = logging.LogRecord("aioloader", logging.WARNING, "f.py", 3, "skipped %s", ("x",), None)
    record.msg, record.args = record.getMessage(), None
    again = _again(m.LogMsg(record))
    assert isinstance(again, m.LogMsg) and again.record.getMessage() == "skipped x"


def test_a_batch_message_costs_the_pipe_no_more_than_the_tuple_did() -> None:
    """Pickled per batch: a named type adds its name, once, and nothing per field."""
    counts = _counts()
    fields = (3, 5, 4, (5,), "*", [1, "a"], [HANDLE], counts)
    named = len(pickle.dumps(m.BatchMsg(*fields), protocol=5))
    assert named <= len(pickle.dumps(("item", *fields), protocol=5)) + 64


def test_back_lines_are_written_and_parsed_in_one_place() -> None:
    msgs: list[m.BackLine] = [m.Released("aioloader-1-2-ab"), m.Taken(7), m.Waited(1.5, 12)]
    data = m.back_lines(*msgs)
    assert data == b"R aioloader-1-2-ab\nC 7\nW 1.500000 12\n"
    assert [m.parse_back(line) for line in data.split(b"\n")[:-1]] == msgs
    assert m.parse_back(b"X 1") is None


def _channel() -> tuple[_Channel, Any, int]:
    parent, child = multiprocessing.Pipe()
    back_r, back_w = os.pipe()
    return _Channel(parent, back_w, Counters(), maps=4), child, back_r


def test_the_trainer_turns_each_report_into_its_item() -> None:
    channel, child, back_r = _channel()
    try:
        assert channel.to_item(m.EndMsg(1, _counts())) is END
        assert channel.counters.device is not None and channel.counters.device.cpu == 3
        failed = channel.to_item(m.FailMsg(1, wire.pack_error(LoaderError("bad file")), _counts()))
        assert isinstance(failed, Failure) and "bad file" in str(failed.error)
        buf = mmap.mmap(-1, 64)
        array = np.frombuffer(buf, dtype=np.uint8)
        located = [wire.Located(HANDLE, int(array.ctypes.data), 64)]
        treedef, leaves, handles = wire.encode(array[:8], located)
        channel.maps._maps[HANDLE.name] = buf  # mapped already: no /proc lookup
        batch = channel.to_item(m.BatchMsg(1, 5, 4, (5,), treedef, leaves, handles, _counts()))
        assert isinstance(batch, Batch) and (batch.index, batch.size, batch.done) == (5, 4, (5,))
        del batch, array
        assert os.read(back_r, 100) == b"R aioloader-1-2-ab\n"  # its views are garbage: given back
        channel.maps._maps.clear()
        buf.close()
    finally:
        channel.close()
        child.close()
        os.close(back_r)


def test_a_bridge_drops_what_is_not_its_runs_and_gives_their_slabs_back() -> None:
    channel, child, back_r = _channel()
    try:
        for msg in (
            m.BatchMsg(1, 0, 4, (), "*", [], [HANDLE], _counts()),
            m.Closed(None),
            m.EndMsg(2, _counts()),
        ):
            child.send_bytes(pickle.dumps(msg, protocol=5))
        run = PipeRun(channel, 2, proc=None)
        assert run.next_ready() is END  # run 1's batch and the Closed passed over
        assert os.read(back_r, 100) == b"R aioloader-1-2-ab\n"
    finally:
        channel.close()
        child.close()
        os.close(back_r)


def test_the_loader_process_dispatches_control_by_type() -> None:
    started: list[tuple[Any, ...]] = []
    task = SimpleNamespace(cancelled=0)
    task.cancel = lambda: setattr(task, "cancelled", task.cancelled + 1)
    closed = asyncio.Event()
    host: Any = SimpleNamespace(run_id=3, task=task, closed=closed)
    host._start_run = lambda *args: started.append(args)
    restore = m.Restore({"corrupt": 1}, 9)
    Host._on_control(host, m.StartRun(4, 1, None, restore))
    assert started == [(4, 1, None, restore)]
    Host._on_control(host, m.CancelRun(2))  # not the current run
    assert task.cancelled == 0
    Host._on_control(host, m.CancelRun(3))
    assert task.cancelled == 1
    Host._on_control(host, m.Close())
    assert closed.is_set()


def test_the_loader_process_dispatches_back_lines_by_type() -> None:
    back_r, back_w = os.pipe()
    counters = Counters()
    credits = SimpleNamespace(released=0)
    credits.release = lambda: setattr(credits, "released", credits.released + 1)
    held: defaultdict[str, deque[Any]] = defaultdict(deque)
    held[HANDLE.name].extend(["batch 1", "batch 2"])
    host: Any = SimpleNamespace(
        back=SimpleNamespace(fileno=lambda: back_r),
        _partial=b"",
        held=held,
        spills=None,
        run_id=7,
        credits=credits,
        counters=counters,
    )
    try:
        # One line cut across two reads: it is parsed once whole.
        data = m.back_lines(m.Released(HANDLE.name), m.Taken(6), m.Taken(7), m.Waited(2.5, 10))
        os.write(back_w, data[:5])
        Host._on_back(host)
        assert list(held[HANDLE.name]) == ["batch 1", "batch 2"]
        os.write(back_w, data[5:])
        Host._on_back(host)
    finally:
        os.close(back_r)
        os.close(back_w)
    assert list(held[HANDLE.name]) == ["batch 2"]
    assert credits.released == 1  # run 6's credit is not this run's
    assert counters.trainer_wait.totals() == (2.5, 10)


# -- the loop <-> a reader process (aioloader/read/readmsgs.py) -------------------------------------


def test_a_group_is_framed_in_one_place_and_parsed_in_one() -> None:
    paths = ["/data/a.jpg", "file:///data/b.jpg"]
    for part in range(PARTS):
        data = readmsgs.frame_group(part, readmsgs.pickle_paths(paths))
        assert data[0] == part
        assert readmsgs.parse_group(data) == readmsgs.Group(part, paths)


def test_a_groups_answer_round_trips() -> None:
    missing = FileNotFoundError(2, "No such file or directory", "/data/c.jpg")
    answer = readmsgs.GroupRead([(0, 13), b"larger than its part", missing], True, [0.001, 0.002, 0.5])
    again = _again(answer)
    assert isinstance(again, readmsgs.GroupRead) and again.files[:2] == answer.files[:2]
    assert (again.slow, again.times) == (True, answer.times)
    assert isinstance(again.files[2], FileNotFoundError) and again.files[2].filename == "/data/c.jpg"


# -- the loader -> a decode worker (aioloader/decode/chunk.py) ----------------------------------


def test_a_chunk_carries_its_shrink_by_name() -> None:
    chunk = Chunk(HANDLE, None, [(0, 4, (0, 10)), (1, 5, b"x")], 7, 2, shrink=Shrink(256, 90, frozenset({1})))
    again = _again(chunk)
    assert again == chunk and isinstance(again.shrink, Shrink) and again.shrink.rows == {1}


# -- the trainer -> its loader process: where the zygote listens (aioloader/procs/zygote.py) -------


def test_the_zygotes_address_crosses_by_name() -> None:
    where = zygote.Address("/tmp/pymp-x/listener-y", 4321)
    assert _again(where) == where and (where.socket, where.pid) == ("/tmp/pymp-x/listener-y", 4321)
    assert _again(zygote.Address(b"\0abstract", 1)).socket == b"\0abstract"


@pytest.mark.parametrize(
    "cls",
    [
        m.BatchMsg,
        m.EndMsg,
        m.FailMsg,
        m.StartRun,
        m.Released,
        LoaderSide,
        DeviceSide,
        readmsgs.GroupRead,
        Shrink,
    ],
)
def test_messages_are_frozen_and_slotted(cls: type) -> None:
    """Slotted (no per-message dict) and frozen: written once, read by attribute."""
    assert "__slots__" in cls.__dict__ and cls.__dataclass_params__.frozen

"""Lifecycle: what a loader starts, and that close, garbage collection and interpreter exit
stop all of it. The autouse ``no_leaks`` fixture checks every test here too."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from pathlib import Path

import pytest
from helpers import (
    decode_number,
    descendants,
    finish_script,
    flatten,
    is_gone,
    session_survivors,
    start_script,
)

from aioloader import Loader
from aioloader.loader import State


def _aioloader_threads() -> set[str]:
    return {t.name.split("_")[0] for t in threading.enumerate() if t.name.startswith("aioloader-")}


def test_start_starts_everything_and_close_joins_it(numbered: list[str]) -> None:
    """In-process (a loader process's own threads: test_loader_process.py)."""
    before = descendants()
    loader = Loader(
        numbered,
        shuffle=False,
        batch_size=4,
        decode=decode_number,
        num_workers=2,
        io_concurrency=3,
        loader_process=False,
    )
    assert loader.state is State.IDLE and not _aioloader_threads()
    with loader:
        assert loader.state is State.STARTED
        assert {"aioloader-loop", "aioloader-transfer"} <= _aioloader_threads()
        next(iter(loader))
        pids = descendants() - before  # the workers (the fork server's children)
        assert len(pids) == 2
        assert any(t.startswith("aioloader-io") for t in _aioloader_threads())
    assert loader.state is State.CLOSED
    assert not _aioloader_threads()
    assert all(is_gone(pid) for pid in pids)


def test_the_pipeline_runs_on_uvloop_when_it_is_installed(numbered: list[str]) -> None:
    """docs/how-it-works/index.md ("One engine; for and async for are two doors into it"):
    stages 1-5 on the loader's own ``aioloader-loop`` thread, on uvloop's loop when uvloop
    is installed."""
    uvloop = pytest.importorskip("uvloop")
    kw = {"decode": decode_number, "num_workers": 1, "loader_process": False}  # its loop is here
    with Loader(numbered, shuffle=False, batch_size=4, **kw) as loader:
        assert flatten([next(iter(loader))]) == [0, 1, 2, 3]
        # Internal on purpose: which event loop runs the pipeline is not observable from outside.
        runtime = loader._runtime
        assert runtime is not None
        loop_thread = runtime.loop_thread
        assert isinstance(loop_thread.loop, uvloop.Loop)
        assert loop_thread.thread.name == "aioloader-loop" and loop_thread.loop.is_running()


def test_workers_persist_across_epochs(numbered: list[str]) -> None:
    before = descendants()
    with Loader(numbered, shuffle=False, batch_size=8, decode=decode_number, num_workers=2) as loader:
        list(loader)
        first = descendants() - before
        assert len(first) == 3  # the loader process and its two workers
        list(loader)
        assert descendants() - before == first


def test_garbage_collection_without_close_stops_everything(numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=2)
    it = iter(loader)
    next(it)  # mid-epoch, work in flight
    ref = weakref.ref(loader)
    del it, loader
    gc.collect()
    assert ref() is None
    assert not _aioloader_threads()


def test_interleaved_loaders(numbered: list[str]) -> None:
    with (
        Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1) as a,
        Loader(numbered[::-1], shuffle=False, batch_size=4, decode=decode_number, num_workers=1) as b,
    ):
        pairs = list(zip(a, b, strict=True))
        with Loader(numbered[:8], shuffle=False, batch_size=4, decode=decode_number, num_workers=1) as inner:
            nested = [flatten(list(inner)) for _ in range(2)]
    assert flatten([p[0] for p in pairs]) == list(range(37))
    assert flatten([p[1] for p in pairs]) == list(range(36, -1, -1))
    assert nested == [list(range(8))] * 2


@pytest.mark.asyncio
async def test_sync_for_inside_a_running_event_loop(numbered: list[str]) -> None:
    """As in a notebook: the engine has its own loop, so a plain ``for`` works here."""
    with Loader(numbered, shuffle=False, batch_size=10, decode=decode_number, num_workers=1) as loader:
        assert sorted(flatten(list(loader))) == list(range(37))


@pytest.mark.asyncio
async def test_interleaved_async_loaders(numbered: list[str]) -> None:
    async with (
        Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1) as a,
        Loader(numbered, batch_size=4, decode=decode_number, num_workers=1, shuffle=True) as b,
    ):
        ia, ib = aiter(a), aiter(b)
        got_a: list[object] = []
        got_b: list[object] = []
        for _ in range(len(a)):
            got_a.append(await anext(ia))
            got_b.append(await anext(ib))
    assert flatten(got_a) == list(range(37))
    assert sorted(flatten(got_b)) == list(range(37))


def test_close_from_another_thread_wakes_the_consumer(numbered: list[str]) -> None:
    from helpers import SlowDecode

    from aioloader import LoaderClosedError

    loader = Loader(numbered, shuffle=False, batch_size=4, decode=SlowDecode(0.5), num_workers=1)
    it = iter(loader)
    timer = threading.Timer(0.2, loader.close)
    timer.start()
    with pytest.raises(LoaderClosedError):
        next(it)
    timer.join()


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from helpers import SlowDecode
import aioloader

if __name__ == "__main__":
    loader = aioloader.Loader({paths!r}, shuffle=False, batch_size=2, decode=SlowDecode(0.05), num_workers=2)
    it = iter(loader)
    next(it)
    print("left open", flush=True)
    # no close: interpreter exit must stop the loop, the bridge and the workers
"""


def test_interpreter_exit_with_an_open_loader(numbered: list[str], tmp_path: Path) -> None:
    text = SCRIPT.format(tests=os.path.dirname(__file__), paths=numbered)
    proc = start_script(tmp_path / "open_at_exit.py", text)
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert "left open" in out
    assert "Traceback" not in err, err
    # No orphan: nothing of that session outlives its parent for long (the fork server and
    # resource tracker exit when they see their pipe to the parent close).
    assert session_survivors(proc.pid) == []

"""The sample cache in a loader (``Loader(..., cache=aioloader.Cache(...))``), on real files, in
both runtimes (``loader_process``) and both stores (``store``: in memory, on disk). Reads of
the source are counted from outside by ``helpers.LoggedRead`` (one line per file read, from
any process); batches are compared with a run without a cache. The cache's parts on their
own are in test_cache_units.py."""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import FailOn, LoggedRead, RuntimeWatch, decode_number, flatten, write_numbered_files
from PIL import Image

from aioloader import Cache, Loader
from aioloader.cache.entries import HEADER
from aioloader.observe.cachestats import CacheStats

N = 20
#: The bytes of one numbered file (``sample-000123``).
SIZE = 13


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def loader_process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes: the pipeline in the trainer's process, or in a loader process (the
    test fails when a loader ran in the other one: ``runtimes``, conftest.py)."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """The cache's folder (``disk``), or None (``memory``)."""
    return tmp_path / "cache" if request.param == "disk" else None


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    """Numbered files of this test's own (tests change and damage them)."""
    return write_numbered_files(tmp_path / "data", N)


@pytest.fixture
def log(tmp_path: Path) -> str:
    path = tmp_path / "reads.log"
    path.touch()
    return str(path)


@pytest.fixture(autouse=True)
def quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aioloader")  # one WARNING per skipped sample


def make(files: list[str], log: str, loader_process: bool, cache: Cache | None, **kw: Any) -> Loader:
    args: dict[str, Any] = {
        "batch_size": 4,
        "decode": decode_number,
        "shuffle": True,
        "seed": 7,
        "num_workers": 1,
        "prefetch": 2,
        "read": LoggedRead(log),
        "loader_process": loader_process,
        "cache": cache,
    }
    args.update(kw)
    return Loader(files, **args)


def epoch(loader: Loader, e: int) -> list[int]:
    """Epoch ``e``'s sample numbers, in delivery order."""
    loader.set_epoch(e)
    return flatten(list(loader))


def take(loader: Loader, n: int) -> list[int]:
    """The sample numbers of the first ``n`` batches of a loop left by ``break`` (the
    batches themselves not kept: a failed assertion would keep their slabs mapped)."""
    got: list[int] = []
    for k, batch in enumerate(loader):
        got += flatten([batch])
        if k + 1 == n:
            break
    return got


def reads(log: str) -> list[str]:
    """The files read from the source since the last call (sorted), and the log emptied."""
    with open(log) as f:
        names = sorted(f.read().split())
    with open(log, "w"):
        pass
    return names


def names(files: list[str]) -> list[str]:
    return sorted(os.path.basename(p) for p in files)


def entry_size(folder: Path | None, data: int = SIZE) -> int:
    """The bytes an entry of ``data`` bytes holds: a header more on disk."""
    return data + (HEADER if folder is not None else 0)


def entry_of(folder: Path, data: bytes) -> Path:
    """The entry file under ``folder`` that holds ``data``."""
    found = [p for p in folder.rglob("*") if p.is_file() and p.read_bytes()[HEADER:] == data]
    assert len(found) == 1, found
    return found[0]


def test_later_epochs_are_served_from_the_cache(
    files: list[str], log: str, loader_process: bool, store: Path | None
) -> None:
    """The first epoch reads every file once and the second none, with the very batches a
    loader without a cache gives; ``stats.cache`` counts each."""
    with make(files, log, loader_process, None) as plain:
        reference = [epoch(plain, 0), epoch(plain, 1)]
    assert reads(log) == sorted(names(files) * 2)
    with make(files, log, loader_process, Cache(directory=store)) as loader:
        first = epoch(loader, 0)
        assert reads(log) == names(files)
        read_then = loader.stats.bytes_read
        second = epoch(loader, 1)
        assert reads(log) == []
        stats = loader.stats.cache
        # bytes_read counts the source's bytes; the hits' are the cache's own figure.
        assert loader.stats.bytes_read == read_then == sum(os.path.getsize(f) for f in files)
    assert [first, second] == reference and sorted(first) == list(range(N))
    assert stats is not None and stats.bytes_served == read_then
    assert (stats.hits, stats.misses, stats.stored, stats.entries) == (N, N, N, N)
    assert (stats.epoch, stats.epoch_hits, stats.epoch_misses, stats.hit_rate) == (1, N, 0, 1.0)
    assert (stats.over_bound, stats.rejected) == (0, 0)
    assert stats.bytes_held == N * entry_size(store) and stats.max_bytes > stats.bytes_held


def test_a_disk_cache_is_reused_by_the_next_loader(
    files: list[str], log: str, loader_process: bool, tmp_path: Path
) -> None:
    """A new loader on the same folder reads nothing from the source in its first epoch and
    delivers the same batches."""
    cache = Cache(directory=tmp_path / "cache")
    with make(files, log, loader_process, cache) as first:
        filled = epoch(first, 0)
    assert reads(log) == names(files)
    with make(files, log, loader_process, cache) as second:
        again = epoch(second, 0)
        stats = second.stats.cache
    assert reads(log) == [] and again == filled
    assert stats is not None and (stats.hits, stats.misses, stats.stored) == (N, 0, 0)


class SlowWrites:
    """A read hook that makes every disk-cache write after it take ``seconds`` longer, in the
    process that reads (the trainer's, or the loader process): the last writes land while
    the loader closes, after the last batch (and, in-process, after ``aclose``'s second)."""

    lock = threading.Lock()

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, path: str) -> bytes:
        from aioloader.cache.diskstore import DiskStore

        with self.lock:
            put = DiskStore.put
            if not getattr(put, "slowed", False):
                seconds = self.seconds

                def slow(store: DiskStore, key: str, data: bytes | memoryview) -> bool:
                    time.sleep(seconds)
                    return put(store, key, data)

                slow.slowed = True  # type: ignore[attr-defined]
                DiskStore.put = slow  # type: ignore[method-assign]
        return Path(path).read_bytes()


def test_stats_after_close_count_every_write_that_landed(
    files: list[str], loader_process: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once ``close()`` returns, ``stats.cache`` counts the writes that landed while it
    closed (on the cache's writer threads, in the loader process too): ``stored`` and
    ``entries`` are the entry files on disk. Writes not begun by then are dropped, not
    counted."""
    from aioloader.cache.diskstore import DiskStore

    monkeypatch.setattr(DiskStore, "put", DiskStore.put)  # put back after the test (in-process)
    folder = tmp_path / "cache"
    loader = Loader(
        files[:4],
        batch_size=4,
        decode=decode_number,
        num_workers=1,
        read=SlowWrites(1.7),
        loader_process=loader_process,
        cache=Cache(directory=folder),
    )
    with loader:
        assert sorted(epoch(loader, 0)) == [0, 1, 2, 3]
    stats = loader.stats.cache
    on_disk = sum(1 for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))
    assert stats is not None and on_disk >= 1
    assert (stats.stored, stats.entries, stats.bytes_held) == (on_disk, on_disk, on_disk * entry_size(folder))


def test_a_changed_source_is_read_again(
    files: list[str], log: str, loader_process: bool, store: Path | None
) -> None:
    """A file rewritten between epochs (same size, a new modification time) is read again
    and delivered as it is now; its new bytes are then kept."""
    with make(files, log, loader_process, Cache(directory=store)) as loader:
        assert sorted(epoch(loader, 0)) == list(range(N))
        reads(log)
        path = files[5]
        st = os.stat(path)
        Path(path).write_bytes(b"sample-000105")  # the same size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert sorted(epoch(loader, 1)) == sorted({*range(N)} - {5} | {105})
        assert reads(log) == [os.path.basename(path)]
        assert sorted(epoch(loader, 2)) == sorted({*range(N)} - {5} | {105})
        assert reads(log) == []


def test_a_file_changed_behind_its_identity_is_served_from_the_cache(
    files: list[str], loader_process: bool, store: Path | None
) -> None:
    """Through the built-in reader: a file rewritten with its size and modification time
    kept is served as the cache holds it (the first bytes), which shows the second epoch
    did not read it; then, given a new time, it is read again."""
    cache = Cache(directory=store)
    kw: dict[str, Any] = {"batch_size": 4, "decode": decode_number, "num_workers": 1, "shuffle": False}
    with Loader(files, loader_process=loader_process, cache=cache, **kw) as loader:
        assert epoch(loader, 0) == list(range(N))
        st = os.stat(files[3])
        Path(files[3]).write_bytes(b"sample-000103")
        os.utime(files[3], ns=(st.st_atime_ns, st.st_mtime_ns))
        assert epoch(loader, 1) == list(range(N))
        stats = loader.stats.cache
        assert stats is not None and (stats.epoch_hits, stats.epoch_misses) == (N, 0)
        os.utime(files[3], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        assert epoch(loader, 2) == [103 if i == 3 else i for i in range(N)]


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 4)


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [_cut, _flip], ids=["cut", "flipped"])
def test_a_damaged_entry_is_read_again_and_replaced(
    files: list[str], log: str, loader_process: bool, tmp_path: Path, damage: Any
) -> None:
    """An entry file cut short or with a byte changed between runs: the next run reads that
    file from the source, delivers its right bytes and counts the entry rejected; the run
    after it reads nothing (the entry was replaced)."""
    cache = Cache(directory=tmp_path / "cache")
    with make(files, log, loader_process, cache) as first:
        reference = epoch(first, 0)
    reads(log)
    entry = entry_of(tmp_path / "cache", b"sample-000003")
    damage(entry)
    with make(files, log, loader_process, cache) as second:
        assert epoch(second, 0) == reference
        stats = second.stats.cache
    assert reads(log) == ["f00003.txt"]
    assert stats is not None and (stats.rejected, stats.hits, stats.misses) == (1, N - 1, 1)
    assert entry.read_bytes()[HEADER:] == b"sample-000003"
    with make(files, log, loader_process, cache) as third:
        assert epoch(third, 0) == reference
        stats = third.stats.cache
    assert reads(log) == []
    assert stats is not None and (stats.rejected, stats.hits) == (0, N)


def test_the_bound_is_kept(files: list[str], log: str, loader_process: bool, store: Path | None) -> None:
    """With room for 10 of the 20 entries (and a few bytes: too few for another), 10 are
    kept, the others are read from the source every epoch and counted over the bound."""
    bound = 10 * entry_size(store) + entry_size(store) - 6
    with make(files, log, loader_process, Cache(directory=store, max_bytes=bound)) as loader:
        assert sorted(epoch(loader, 0)) == list(range(N))
        assert reads(log) == names(files)
        assert sorted(epoch(loader, 1)) == list(range(N))
        again = reads(log)
        stats = loader.stats.cache
    assert stats is not None and len(again) == 10 and set(again) < set(names(files))
    assert (stats.epoch_hits, stats.epoch_misses, stats.entries) == (10, 10, 10)
    assert stats.bytes_held == 10 * entry_size(store) <= stats.max_bytes == bound
    assert stats.over_bound >= 10
    if store is not None:
        assert sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) == stats.bytes_held


def test_a_failed_sample_is_not_kept(
    files: list[str], log: str, loader_process: bool, store: Path | None
) -> None:
    """A sample whose decode fails (skipped) is never cached: each epoch reads it again and
    fails it again, while the others are hits."""
    kw = {"decode": FailOn({3}), "on_error": "skip"}
    with make(files, log, loader_process, Cache(directory=store), **kw) as loader:
        assert sorted(epoch(loader, 0)) == [i for i in range(N) if i != 3]
        assert reads(log) == names(files)
        assert sorted(epoch(loader, 1)) == [i for i in range(N) if i != 3]
        assert reads(log) == ["f00003.txt"]
        stats = loader.stats
    assert stats.failures == 2
    assert stats.cache is not None and (stats.cache.epoch_hits, stats.cache.epoch_misses) == (N - 1, 1)
    assert (stats.cache.stored, stats.cache.entries) == (N - 1, N - 1)


def test_raw_bytes_are_served_from_the_cache(
    files: list[str], log: str, loader_process: bool, store: Path | None
) -> None:
    """``decode=None``: the second epoch delivers the files' bytes from the cache, reading
    none of them."""
    want = [Path(p).read_bytes() for p in files]
    with make(files, log, loader_process, Cache(directory=store), decode=None, shuffle=False) as loader:
        first = [data for batch in loader for data in batch]
        assert reads(log) == names(files)
        loader.set_epoch(1)
        second = [data for batch in loader for data in batch]
        assert reads(log) == []
    assert first == second == want


def test_resume_with_a_disk_cache_gives_the_remaining_batches(
    files: list[str], log: str, loader_process: bool, tmp_path: Path
) -> None:
    """A state saved mid-epoch, loaded by a new loader on the same disk cache, gives the
    batches an uninterrupted run gives, with no read of the source."""
    with make(files, log, loader_process, None) as plain:
        reference = [epoch(plain, 0), epoch(plain, 1)]
    cache = Cache(directory=tmp_path / "cache")
    with make(files, log, loader_process, cache) as first:
        assert epoch(first, 0) == reference[0]
        first.set_epoch(1)
        taken = take(first, 2)
        state = first.state_dict()
    reads(log)
    with make(files, log, loader_process, cache) as second:
        second.load_state_dict(state)
        rest = flatten(list(second))
    assert taken + rest == reference[1]
    assert reads(log) == []


# -- max_side ---------------------------------------------------------------------------------


def _image(size: tuple[int, int], orientation: int | None = None, fmt: str = "JPEG") -> bytes:
    w, h = size
    a = np.random.default_rng(w * h).integers(0, 255, (h, w, 3), dtype=np.uint8)
    save: dict[str, Any] = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt, **save)
    return buf.getvalue()


def received(data: bytes) -> np.ndarray:
    """What the decode received: an image's ``[width, height, EXIF orientation]``; for
    anything else, ``[-1, length, 0]``."""
    if data.startswith(b"not an image"):
        return np.array([-1, len(data), 0])
    img = Image.open(io.BytesIO(data))
    return np.array([img.width, img.height, img.getexif().get(0x0112, 1)])


def test_max_side_keeps_small_upright_images(
    tmp_path: Path, log: str, loader_process: bool, store: Path | None
) -> None:
    """Every epoch, the first included, decodes the kept JPEGs (made by the worker just
    before the first decode): longer side ``max_side``, aspect kept, EXIF orientation
    applied. A small image and a file that is no image are kept as they are."""
    folder = tmp_path / "images"
    folder.mkdir()
    made = {
        "a.jpg": _image((640, 480)),
        "b.jpg": _image((480, 640)),
        "c.jpg": _image((400, 300), orientation=6),  # upright: 300x400
        "d.txt": b"not an image, kept as it is",
        "e.png": _image((64, 48), fmt="PNG"),
    }
    paths = []
    for name, data in made.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    cache = Cache(directory=store, max_side=100)
    kw = {"decode": received, "batch_size": 5, "shuffle": False}
    with make(paths, log, loader_process, cache, **kw) as loader:
        first = [row.tolist() for batch in loader for row in batch]
        assert reads(log) == sorted(made)
        loader.set_epoch(1)
        second = [row.tolist() for batch in loader for row in batch]
        assert reads(log) == []
        stats = loader.stats.cache
    small = [[100, 75, 1], [75, 100, 1], [75, 100, 1], [-1, 27, 0], [64, 48, 1]]
    assert first == small and second == small
    assert stats is not None and stats.entries == 5
    assert stats.bytes_held < sum(len(d) for d in made.values()) // 4


# -- what a loader without a cache, and with one, shows -----------------------------------------


def test_stats_cache_is_none_without_a_cache(files: list[str], log: str, loader_process: bool) -> None:
    with make(files, log, loader_process, None) as loader:
        epoch(loader, 0)
        assert loader.stats.cache is None


def test_the_cache_threads_run_while_loading_and_end_with_the_loader(
    files: list[str], log: str, store: Path | None, runtimes: RuntimeWatch
) -> None:
    """In-process, the cache's threads (``aioloader-cache_N``) are there while it loads and
    gone once the loader is closed (the leak check, conftest.py, checks every test too)."""
    runtimes.expect(False)
    with make(files, log, False, Cache(directory=store)) as loader:
        epoch(loader, 0)
        assert any(t.name.startswith("aioloader-cache") for t in threading.enumerate())
        assert isinstance(loader.stats.cache, CacheStats)
    assert not any(t.name.startswith("aioloader-cache") for t in threading.enumerate())

"""The sample cache's edges, each a fix made after a review: byte ranges of one object or file
kept apart, relative paths keyed absolute, an entry that cannot be read or written (a miss and
one WARNING, never a lost sample), ``max_side`` past the bound, ``Cache(directory="")``, the
temporary files a store removes on opening (only those no writer holds locked), and
``sample_timeout`` bounding the cache's answer. Helpers come from test_cache.py and
test_cache_procs.py."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import decode_number, write_numbered_files
from PIL import Image
from test_cache import epoch, make, reads
from test_cache_procs import BUCKET, bare, object_path, since
from test_cache_units import _dead_pid

from aioloader import Cache, FileDataset, Loader
from aioloader.cache.diskstore import STALE, DiskStore
from aioloader.cache.entries import HEADER, entry_key, relpath
from aioloader.cache.identity import Identities
from aioloader.cache.samples import UNKEPT, SampleCache
from aioloader.decode.shrink import shrink

#: What the sample cache says when it cannot keep an entry (aioloader.cache.samples).
UNKEPT_WARNING = "could not keep an entry"


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """The cache's folder (``disk``), or None (``memory``)."""
    return tmp_path / "cache" if request.param == "disk" else None


@pytest.fixture
def log(tmp_path: Path) -> str:
    """The file ``helpers.LoggedRead`` notes each read of the source in (test_cache.reads)."""
    path = tmp_path / "reads.log"
    path.touch()
    return str(path)


def numbers(loader: Loader) -> list[int]:
    """One epoch of ``decode_number`` samples, in delivery order."""
    return [int(v) for batch in loader for v in batch.reshape(-1).tolist()]


def file_key(cache: Cache, path: str) -> str:
    """The key a local file's entry has now: its absolute path, size and mtime."""
    st = os.stat(path)
    return entry_key(cache.fingerprint, os.path.abspath(path), None, (st.st_size, str(st.st_mtime_ns)))


def unkept_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "aioloader" and r.levelno == logging.WARNING and UNKEPT_WARNING in r.getMessage()
    ]


# -- 1. byte ranges of one object are kept apart ---------------------------------------------

#: The samples a shard holds back to back (13 bytes each).
SHARD = [f"sample-{n:06d}".encode() for n in (100, 101, 102, 103)]


def shard_entries(source: str) -> FileDataset:
    """``SHARD``'s samples as byte ranges of ``source``."""
    out, at = [], 0
    for data in SHARD:
        out.append((source, at, len(data)))
        at += len(data)
    return FileDataset(out)


SHARD_KW: dict[str, Any] = {"batch_size": 4, "decode": decode_number, "shuffle": False, "num_workers": 1}


def test_byte_ranges_of_one_object_are_kept_apart(
    moto_s3: dict[str, object],
    s3_proxy: dict[str, object],
    store: Path | None,
    request: pytest.FixtureRequest,
) -> None:
    """Four samples as byte ranges of one S3 object: each epoch delivers each range's own
    bytes, the second without a request for the object; a new run on the same disk folder
    delivers them from it, with a HEAD and no GET."""
    from servers import s3_client, server_requests

    proxy = str(s3_proxy["proxy"])
    key = f"edges/{request.node.callspec.id}/shard0.bin"
    client = s3_client(moto_s3)  # uploaded past the proxy, which relays reads only
    client.put_object(Bucket=BUCKET, Key=key, Body=b"".join(SHARD))
    url = f"s3://{BUCKET}/{key}"
    obj = object_path(url)
    want = [100, 101, 102, 103]
    kw = {"storage_options": bare(s3_proxy), "cache": Cache(directory=store), "loader_process": False}
    try:
        start = server_requests(proxy)
        with Loader(shard_entries(url), **SHARD_KW, **kw) as loader:
            first = numbers(loader)
            mid = server_requests(proxy)
            second = numbers(loader)
            end = server_requests(proxy)
            stats = loader.stats.cache
        assert first == second == want
        filled = since(start, mid)
        assert filled.get(f"HEAD {obj}") == 1 and filled.get(f"GET {obj}", 0) >= 1  # one HEAD per URL
        assert since(mid, end) == {}  # epoch 2: no request at all
        assert stats is not None and (stats.epoch_hits, stats.entries) == (4, 4)
        if store is not None:
            before = server_requests(proxy)
            with Loader(shard_entries(url), **SHARD_KW, **kw) as loader:
                again = numbers(loader)
            asked = since(before, server_requests(proxy))
            assert again == want
            assert asked.get(f"HEAD {obj}") == 1 and f"GET {obj}" not in asked
    finally:
        client.delete_object(Bucket=BUCKET, Key=key)
        client.close()


def test_byte_ranges_of_one_file_are_kept_apart(tmp_path: Path, store: Path | None) -> None:
    """Four samples as byte ranges of one local file: every epoch, and a new run on the same
    disk folder, deliver each range's own bytes, the second epoch from the cache."""
    shard = tmp_path / "shard0.bin"
    shard.write_bytes(b"".join(SHARD))
    cache = Cache(directory=store)
    want = [100, 101, 102, 103]
    with Loader(shard_entries(str(shard)), cache=cache, loader_process=False, **SHARD_KW) as loader:
        assert numbers(loader) == want
        assert numbers(loader) == want
        stats = loader.stats.cache
    assert stats is not None and (stats.epoch_hits, stats.entries) == (4, 4)
    if store is not None:
        with Loader(shard_entries(str(shard)), cache=cache, loader_process=False, **SHARD_KW) as loader:
            assert numbers(loader) == want
            stats = loader.stats.cache
        assert stats is not None and (stats.hits, stats.misses) == (4, 0)


# -- 2. relative paths are keyed absolute ------------------------------------------------------


def test_a_relative_path_is_keyed_by_its_absolute_path(
    tmp_path: Path, log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data/x.bin`` from two working folders, the files alike in size and mtime but not in
    content: a disk cache filled from the first serves the second its own bytes."""
    mtime = 1_700_000_000_123_456_789
    for folder, data in (("a", b"sample-000001"), ("b", b"sample-000002")):
        path = tmp_path / folder / "data" / "x.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        os.utime(path, ns=(mtime, mtime))
    cache = Cache(directory=tmp_path / "cache")
    kw: dict[str, Any] = {"decode": None, "shuffle": False}
    monkeypatch.chdir(tmp_path / "a")
    with make(["data/x.bin"], log, False, cache, **kw) as loader:
        assert [d for batch in loader for d in batch] == [b"sample-000001"]
    monkeypatch.chdir(tmp_path / "b")
    with make(["data/x.bin"], log, False, cache, **kw) as loader:
        assert [d for batch in loader for d in batch] == [b"sample-000002"]
        stats = loader.stats.cache
    assert stats is not None and (stats.hits, stats.misses) == (0, 1)


# -- 3. an entry that cannot be read or written ------------------------------------------------

N = 8


def test_an_entry_that_cannot_be_read_is_a_miss(
    tmp_path: Path, log: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry file replaced by a folder of its name: the next run reads that one file from
    the source, delivers every sample right and raises nothing."""
    caplog.set_level(logging.WARNING, logger="aioloader")
    files = write_numbered_files(tmp_path / "data", N)
    cache = Cache(directory=tmp_path / "cache")
    with make(files, log, False, cache) as loader:
        reference = epoch(loader, 0)
    assert sorted(reference) == list(range(N)) and len(reads(log)) == N
    entry = tmp_path / "cache" / relpath(file_key(cache, files[3]))
    entry.unlink()
    entry.mkdir()
    with make(files, log, False, cache) as loader:
        assert epoch(loader, 0) == reference
        stats = loader.stats.cache
    assert reads(log) == ["f00003.txt"]
    assert stats is not None and (stats.hits, stats.misses, stats.rejected) == (N - 1, 1, 0)


def test_an_entry_that_cannot_be_written_logs_one_warning_and_loses_no_sample(
    tmp_path: Path, log: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two entries whose paths are folders (their renames fail, IsADirectoryError): every
    epoch delivers every sample, those two read from the source each time; one WARNING on
    the ``aioloader`` logger says so, once for the run."""
    caplog.set_level(logging.WARNING, logger="aioloader")
    files = write_numbered_files(tmp_path / "data", N)
    cache = Cache(directory=tmp_path / "cache")
    for i in (2, 5):
        (tmp_path / "cache" / relpath(file_key(cache, files[i]))).mkdir(parents=True)
    with make(files, log, False, cache) as loader:
        assert sorted(epoch(loader, 0)) == list(range(N))
        assert len(reads(log)) == N
        assert sorted(epoch(loader, 1)) == list(range(N))
        assert reads(log) == ["f00002.txt", "f00005.txt"]
        stats = loader.stats.cache
    assert stats is not None and (stats.stored, stats.epoch_hits, stats.epoch_misses) == (N - 2, N - 2, 2)
    stats = loader.stats.cache  # once closed: every write counted, the last epoch's too
    assert stats is not None and (stats.write_errors, stats.over_bound) == (4, 0)  # tried each epoch
    warned = unkept_warnings(caplog)
    assert len(warned) == 1 and "EISDIR: Is a directory" in warned[0].getMessage()


def test_each_kind_of_failed_write_logs_one_warning(
    tmp_path: Path, log: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes failing two ways, each twice: two entries whose paths are folders (EISDIR), and
    a file lying where another entry's sub-folder goes (ENOTDIR). One WARNING per kind, naming
    its cause and the entry's file; every failed write counted in ``write_errors``."""
    caplog.set_level(logging.WARNING, logger="aioloader")
    files = write_numbered_files(tmp_path / "data", N)
    cache = Cache(directory=tmp_path / "cache")
    rels = [relpath(file_key(cache, f)) for f in files]
    subs = [r.split("/")[0] for r in rels]
    alone = [i for i, sub in enumerate(subs) if subs.count(sub) == 1]  # their sub-folder theirs alone
    assert len(alone) >= 3, rels  # 8 random keys in 256 sub-folders
    (tmp_path / "cache").mkdir()
    for i in alone[:2]:
        (tmp_path / "cache" / rels[i]).mkdir(parents=True)
    (tmp_path / "cache" / subs[alone[2]]).write_bytes(b"not a folder")
    with make(files, log, False, cache) as loader:
        for e in range(2):
            assert sorted(epoch(loader, e)) == list(range(N))
    stats = loader.stats.cache  # once closed: every write counted, the last epoch's too
    assert stats is not None and (stats.stored, stats.write_errors, stats.over_bound) == (N - 3, 6, 0)
    warned = sorted(r.getMessage() for r in unkept_warnings(caplog))
    assert len(warned) == 2, warned
    assert "EISDIR: Is a directory" in warned[0] and any(rels[i] in warned[0] for i in alone[:2])
    assert "ENOTDIR: Not a directory" in warned[1] and rels[alone[2]] in warned[1]


# -- 4. max_side past the bound ----------------------------------------------------------------

SIDE = 64


def _jpeg() -> bytes:
    a = np.random.default_rng(5).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG")
    return buf.getvalue()


def size_received(data: bytes) -> np.ndarray:
    """The ``[width, height]`` of the image the decode received."""
    with Image.open(io.BytesIO(data)) as img:
        return np.array([img.width, img.height])


@pytest.mark.parametrize("slack", [0, 1], ids=["full", "room-left"])
def test_max_side_decodes_small_past_the_bound(
    tmp_path: Path, log: str, store: Path | None, slack: int, caplog: pytest.LogCaptureFixture
) -> None:
    """With room for two of eight 320x240 images made small, every sample the decode receives
    in every epoch is the small one, those not kept included: once the cache is full (no
    room at all: its misses are not kept) and while it has room, but too little for one more
    (each refused as it is kept)."""
    caplog.set_level(logging.ERROR, logger="aioloader")
    folder = tmp_path / "images"
    folder.mkdir()
    data = _jpeg()  # the same image in each file: each entry the same size
    made = shrink(data, SIDE, 90)
    assert made is not None
    paths = []
    for i in range(8):
        (folder / f"{i}.jpg").write_bytes(data)
        paths.append(str(folder / f"{i}.jpg"))
    entry = len(made) + (HEADER if store is not None else 0)
    cache = Cache(directory=store, max_side=SIDE, max_bytes=2 * entry + slack * entry // 2)
    kw = {"decode": size_received, "batch_size": 2, "shuffle": False}
    with make(paths, log, False, cache, **kw) as loader:
        got = [epoch(loader, e) for e in range(2)]
        stats = loader.stats.cache
    assert got == [[SIDE, SIDE * 3 // 4] * 8] * 2
    assert stats is not None and (stats.entries, stats.stored, stats.epoch_misses) == (2, 2, 6)
    assert len(reads(log)) == 8 + 6
    # Each miss not kept counts once: when served (no room) or when its write is refused, which
    # for the last epoch's last samples may be after the epoch ends.
    assert stats.over_bound == 12 if not slack else 6 <= stats.over_bound <= 12


# -- 5. Cache(directory="") --------------------------------------------------------------------


def test_an_empty_directory_is_refused() -> None:
    """``Cache(directory="")`` is no folder (it would be the working one): refused, naming
    ``directory``."""
    with pytest.raises(ValueError, match=r"Cache\(directory=''\)"):
        Cache(directory="")


# -- 6. temporary files ------------------------------------------------------------------------

LOCKER = """
import fcntl, os, sys, time
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def test_a_store_removes_only_the_temporary_files_no_writer_holds(tmp_path: Path) -> None:
    """Opening a store keeps a temporary file another process holds locked (a writer in
    another PID namespace), whatever its pid or age, and the fresh one of a live pid; it
    removes one of a pid that is gone, and one of a live pid a minute old, when unlocked."""
    folder = tmp_path / "c"
    sub = folder / "ab"
    sub.mkdir(parents=True)
    key = "ab" + "0" * 30
    dead = _dead_pid()
    own = os.getpid()
    locked_dead = sub / f".tmp-{dead}-1-{key}"
    unlocked_dead = sub / f".tmp-{dead}-2-{key}"
    locked_old = sub / f".tmp-{own}-3-{key}"
    unlocked_old = sub / f".tmp-{own}-4-{key}"
    fresh = sub / f".tmp-{own}-5-{key}"
    for p in (locked_dead, unlocked_dead, locked_old, unlocked_old, fresh):
        p.write_bytes(b"half an entry")
    past = time.time() - 2 * STALE
    for p in (locked_old, unlocked_old):
        os.utime(p, (past, past))
    child = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(locked_dead), str(locked_old)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        DiskStore(folder, 10**6).open()
        assert locked_dead.exists() and locked_old.exists() and fresh.exists()
        assert not unlocked_dead.exists() and not unlocked_old.exists()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    store = DiskStore(folder, 10**6)
    store.open()  # the locks went with their holder
    assert not locked_dead.exists() and not locked_old.exists() and fresh.exists()
    assert (store.entries, store.held) == (0, 0)


# -- 7. sample_timeout bounds the cache --------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_a_cache_that_does_not_answer_within_sample_timeout_is_all_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys that take longer than ``sample_timeout`` (0.2 s; here 5 s, then keys that would
    be kept): :meth:`SampleCache.serve` answers without them, every sample a miss not kept."""
    cache = SampleCache(Cache(), 1 << 20, timeout=0.2)

    async def slow_keys(paths: list[str], spans: object) -> list[str]:
        await asyncio.sleep(5)
        return [f"{i:032x}" for i in range(len(paths))]

    try:
        monkeypatch.setattr(cache.ids, "keys", slow_keys)
        paths = write_numbered_files(tmp_path / "data", 3)
        got, fills = await cache.serve(paths, None, None)
        assert got == [None, None, None] and fills == [UNKEPT, UNKEPT, UNKEPT]
        assert (cache.stats.hits, cache.stats.misses, cache.stats.over_bound) == (0, 3, 0)
    finally:
        cache.close()


@pytest.mark.timeout(30)
def test_a_loader_bounds_its_cache_by_its_sample_timeout(
    tmp_path: Path, log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through a loader (in-process): with ``sample_timeout=2`` and keys that take
    20 s, the epoch is read from the source, whole, and nothing is kept."""

    async def slow_keys(self: Identities, paths: list[str], spans: object) -> list[str]:
        await asyncio.sleep(20)
        return [f"{i:032x}" for i in range(len(paths))]

    monkeypatch.setattr(Identities, "keys", slow_keys)
    files = write_numbered_files(tmp_path / "data", 4)
    with make(files, log, False, Cache(), batch_size=4, sample_timeout=2.0) as loader:
        assert sorted(epoch(loader, 0)) == [0, 1, 2, 3]
        stats = loader.stats.cache
    assert len(reads(log)) == 4
    assert stats is not None and (stats.misses, stats.stored, stats.entries) == (4, 0, 0)

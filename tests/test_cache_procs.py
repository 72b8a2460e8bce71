"""The sample cache (``Loader(cache=aioloader.Cache(...))``) with real servers, real processes
and real signals: nothing here mocks aioloader.

- Objects (moto's S3 behind the proxy of servers.py, which counts each request by method and
  path; the aiohttp file server): an epoch served from the cache makes no request at all; a
  disk cache reused by a later run costs one HEAD per object and no GET; a server that gives
  no ETag or Last-Modified is cached in memory but never on disk. Each case runs in the
  trainer's process (fsspec) and in a loader process through obstore and through fsspec.
- A disk cache shared by two processes filling it at once, and one whose writer is killed
  (SIGKILL) mid-fill or whose entries a power loss damaged: what a later run serves is what
  the source holds, byte for byte, and the damaged entries are written again.
- A memory cache in the loader process is gone with it; under a cgroup memory limit its
  default bound is a quarter of what the cgroup leaves.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    LoggedRead,
    RuntimeWatch,
    decode_head,
    decode_number,
    finish_script,
    is_gone,
    kill_session,
    named,
    script_env,
    session_survivors,
    start_script,
    write_sized_files,
)
from servers import server_requests, server_stats

from aioloader import Cache, Loader
from aioloader.base.cgmemory import cgroup_room
from aioloader.cache.entries import HEADER, check, crc_ok, entry_key
from aioloader.cache.memstore import REGION

BUCKET = "aioloader-test"


@pytest.fixture(
    params=[
        {"loader_process": False},
        {"loader_process": True, "storage_backend": "obstore"},
        {"loader_process": True, "storage_backend": "fsspec"},
    ],
    ids=["thread", "process-obstore", "process-fsspec"],
)
def where(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> dict[str, Any]:
    """Where the reads run, and through which client (as in test_remote.py); the uncached
    local runs compared with are in-process."""
    if request.param.get("storage_backend") == "obstore":
        pytest.importorskip("obstore")
    runtimes.expect(request.param["loader_process"], in_process_too=True)
    return dict(request.param)


# -- what the tests look at -------------------------------------------------------------------


def values(batches: list[Any]) -> list[list[int]]:
    return [[int(v) for v in b] for b in batches]


def epochs(loader: Loader, n: int) -> list[list[list[int]]]:
    return [values(list(loader)) for _ in range(n)]


KW: dict[str, Any] = {"batch_size": 5, "decode": decode_number, "seed": 7, "num_workers": 1}


def uncached(paths: list[str], n: int, **kw: Any) -> list[list[list[int]]]:
    """``n`` epochs of the local files, in-process, without a cache: what every cached run
    must deliver, batch for batch."""
    with Loader(paths, loader_process=False, **{**KW, **kw}) as loader:
        return epochs(loader, n)


def bare(options: dict[str, object]) -> dict[str, object]:
    """``s3_proxy``'s options without its ``proxy`` entry (not a storage option)."""
    return {k: v for k, v in options.items() if k != "proxy"}


def object_path(url: str) -> str:
    """The path a request for ``url`` (``s3://bucket/key`` or ``http://host/name``) has."""
    rest = url.split("://", 1)[1]
    return "/" + rest if url.startswith("s3://") else "/" + rest.split("/", 1)[1]


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The requests counted between two :func:`server_requests` snapshots."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def entry_files(folder: Path) -> list[Path]:
    """A disk cache's entry files (its two-digit sub-folders, temporary files left out)."""
    return sorted(p for p in folder.glob("??/*") if not p.name.startswith(".tmp-"))


def tmp_files(folder: Path) -> list[Path]:
    """A disk cache's temporary files (``.tmp-<pid>-<thread>-<key>``)."""
    return sorted(folder.glob("??/.tmp-*"))


def entry_ok(path: Path) -> bool:
    """The file passes every check a read makes: header, key, length, CRC."""
    data = path.read_bytes()
    return check(path.name, data[:HEADER], len(data)) is not None and crc_ok(data[:HEADER], data[HEADER:])


def file_key(cache: Cache, path: str) -> str:
    """The key a local file's entry has now (aioloader.cache.entries)."""
    st = os.stat(path)
    return entry_key(cache.fingerprint, path, None, (st.st_size, str(st.st_mtime_ns)))


# -- objects: an epoch from the cache makes no request ------------------------------------------


def test_s3_an_epoch_from_a_memory_cache_makes_no_request(
    s3_proxy: dict[str, object], numbered: list[str], where: dict[str, Any]
) -> None:
    """Epoch 1 reads each object once and asks for its identity once (one HEAD, one GET);
    epoch 2 is served from memory without a single request, in another shuffled order,
    the same batches as two epochs of the local files without a cache."""
    proxy = str(s3_proxy["proxy"])
    urls = [f"s3://{BUCKET}/numbered/{os.path.basename(p)}" for p in numbered]
    start = server_requests(proxy)
    with Loader(urls, storage_options=bare(s3_proxy), cache=Cache(), **where, **KW) as loader:
        first = values(list(loader))
        mid, count = server_requests(proxy), server_stats(proxy)["requests"]
        second = values(list(loader))
        end, count_end = server_requests(proxy), server_stats(proxy)["requests"]
        stats = loader.stats.cache
    assert [first, second] == uncached(numbered, 2)
    filled = since(start, mid)
    for url in urls:
        assert filled.get(f"HEAD {object_path(url)}") == 1 and filled.get(f"GET {object_path(url)}") == 1
    assert since(mid, end) == {} and count_end == count  # epoch 2: no request at all
    assert stats is not None
    assert (stats.epoch_hits, stats.epoch_misses, stats.stored) == (len(urls), 0, len(urls))


def test_s3_a_disk_cache_reused_by_a_new_run_costs_one_head_per_object(
    s3_proxy: dict[str, object], numbered: list[str], where: dict[str, Any], tmp_path: Path
) -> None:
    """Run 1 fills a disk cache. Run 2, a new loader on the same folder: its first epoch asks
    each object for its identity (one HEAD each, besides the one listing of the bucket every
    run makes) and reads no object; its second epoch makes no request. Both deliver what the
    local files do."""
    proxy = str(s3_proxy["proxy"])
    urls = [f"s3://{BUCKET}/numbered/{os.path.basename(p)}" for p in numbered]
    cache = Cache(directory=tmp_path / "cache")
    kw = {"storage_options": bare(s3_proxy), "cache": cache, **where, **KW}
    with Loader(urls, **kw) as loader:
        filled = epochs(loader, 2)
    assert len(entry_files(tmp_path / "cache")) == len(urls)
    start, count = server_requests(proxy), server_stats(proxy)["requests"]
    with Loader(urls, **kw) as loader:
        first = values(list(loader))
        mid, count_mid = server_requests(proxy), server_stats(proxy)["requests"]
        second = values(list(loader))
        end, count_end = server_requests(proxy), server_stats(proxy)["requests"]
        stats = loader.stats.cache
    assert filled == [first, second] == uncached(numbered, 2)
    reused = since(start, mid)
    heads = {f"HEAD {object_path(u)}": 1 for u in urls}
    others = {k: n for k, n in reused.items() if k not in heads}
    assert {k: n for k, n in reused.items() if k in heads} == heads  # one HEAD per object
    # Besides: the bucket's listing (RemoteStore._check_bucket, once per run), no GET of an object.
    assert list(others.values()) == [1] and next(iter(others)).startswith(f"GET /{BUCKET}"), others
    assert "/numbered/" not in next(iter(others))
    assert count_mid - count == len(urls) + 1
    assert since(mid, end) == {} and count_end == count_mid
    assert stats is not None
    assert (stats.hits, stats.misses, stats.stored, stats.rejected) == (2 * len(urls), 0, 0, 0)


def test_http_without_etag_is_cached_in_memory_but_not_on_disk(
    http_files: str, numbered: list[str], where: dict[str, Any], tmp_path: Path
) -> None:
    """The file server sends neither ETag nor Last-Modified (checked first), so a changed
    file could not be told apart next run: a memory cache (this run only) serves epoch 2
    without a request; a disk cache keeps nothing, and every epoch reads each object once
    (its identity asked for once per run, not again each epoch)."""
    urls = [f"{http_files}/{os.path.basename(p)}" for p in numbered]
    with urllib.request.urlopen(urllib.request.Request(urls[0], method="HEAD"), timeout=10) as resp:
        assert resp.headers.get("ETag") is None and resp.headers.get("Last-Modified") is None
    expected = uncached(numbered, 2, shuffle=False)
    kw = {**where, **KW, "shuffle": False}
    with Loader(urls, cache=Cache(), **kw) as loader:
        first = values(list(loader))
        count = server_stats(http_files)["requests"]
        second = values(list(loader))
        assert server_stats(http_files)["requests"] == count  # epoch 2: no request
        stats = loader.stats.cache
    assert [first, second] == expected
    assert stats is not None and (stats.epoch_hits, stats.stored) == (len(urls), len(urls))

    folder = tmp_path / "cache"
    with Loader(urls, cache=Cache(directory=folder), **kw) as loader:
        first = values(list(loader))
        mid = server_requests(http_files)
        second = values(list(loader))
        end = server_requests(http_files)
        stats = loader.stats.cache
    assert [first, second] == expected
    assert stats is not None
    assert (stats.stored, stats.entries, stats.hits, stats.misses) == (0, 0, 0, 2 * len(urls))
    assert entry_files(folder) == [] and tmp_files(folder) == []
    assert since(mid, end) == {f"GET {object_path(u)}": 1 for u in urls}


# -- a disk cache filled by two processes at once ---------------------------------------------

FILLER = """
import os, sys, time
from helpers import LoggedRead, decode_head
from aioloader import Cache, Loader

paths, folder, go, log = {paths!r}, {folder!r}, {go!r}, {log!r}
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
read = LoggedRead(log, slow=frozenset(paths), seconds=0.005)
with Loader(paths, batch_size=4, decode=decode_head, shuffle=False, num_workers=1, read=read,
            cache=Cache(directory=folder)) as loader:
    got = [int(row[0]) for b in loader for row in b]
    stats = loader.stats.cache
print("values", *got)
print("rejected", stats.rejected)
"""


class Watcher(threading.Thread):
    """Looks at every entry file of ``folder`` over and over, as a reader would (its header
    against its size), until stopped: ``seen`` holds the files that failed, at any moment."""

    def __init__(self, folder: Path) -> None:
        super().__init__(name="test-watcher", daemon=True)
        self.folder = folder
        self.seen: set[str] = set()
        self.looks = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for path in entry_files(self.folder):
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    if check(path.name, os.pread(fd, HEADER, 0), os.fstat(fd).st_size) is None:
                        self.seen.add(path.name)
                finally:
                    os.close(fd)
                self.looks += 1


@pytest.mark.slow
def test_two_processes_filling_one_folder_leave_one_whole_entry_per_sample(tmp_path: Path) -> None:
    """Two trainers (each its own loader process) fill the same folder from the same files
    (1 MiB each), released together: both deliver every sample, and neither ever finds an
    entry cut short, nor does a watcher looking at the folder all along (entries are written
    aside and renamed); the folder then holds exactly one entry per sample, under the key
    its file has, each passing its checks, and no temporary file; a third loader reads
    nothing from the source."""
    paths = write_sized_files(tmp_path / "files", [1 << 20] * 16)
    folder, go = tmp_path / "cache", tmp_path / "go"
    procs = []
    for i in range(2):
        text = FILLER.format(paths=paths, folder=str(folder), go=str(go), log=str(tmp_path / f"read{i}.log"))
        procs.append(start_script(tmp_path / f"filler{i}.py", text))
    watcher = Watcher(folder)
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        watcher.start()
        go.touch()
        outs = [finish_script(proc, timeout=120) for proc in procs]
    finally:
        watcher.done.set()
        if watcher.is_alive():
            watcher.join()
        for proc in procs:
            if proc.poll() is None:
                kill_session(proc)
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
        lines = dict(line.split(" ", 1) for line in out.splitlines())
        assert [int(v) for v in lines["values"].split()] == list(range(len(paths)))
        assert lines["rejected"] == "0"
    assert watcher.seen == set() and watcher.looks > 0
    cache = Cache(directory=folder)
    entries = entry_files(folder)
    assert sorted(p.name for p in entries) == sorted(file_key(cache, p) for p in paths)
    assert tmp_files(folder) == []
    assert all(entry_ok(p) for p in entries)
    log = tmp_path / "third.log"
    log.touch()
    with Loader(
        paths, batch_size=4, decode=decode_head, shuffle=False, read=LoggedRead(str(log)), cache=cache
    ) as loader:
        got = [tuple(row) for b in loader for row in b.tolist()]
        stats = loader.stats.cache
    assert got == [(i, 1 << 20) for i in range(len(paths))]
    assert log.read_text() == ""  # not one read of the source
    assert stats is not None and (stats.hits, stats.misses, stats.rejected) == (len(paths), 0, 0)


# -- a writer killed mid-fill, entries a power loss damaged ------------------------------------

KILLED = """
from helpers import SlowDecode
from aioloader import Cache, Loader

paths, folder, process = {paths!r}, {folder!r}, {process!r}
with Loader(paths, batch_size=2, decode=SlowDecode(0.1), shuffle=False, num_workers=1,
            loader_process=process, cache=Cache(directory=folder)) as loader:
    print("started", flush=True)
    while True:
        for batch in loader:
            pass
"""


def _loader_process_of(session: int) -> set[int]:
    """The loader processes (``aioloader-loop``) of a script's session."""
    out = subprocess.run(["pgrep", "-s", str(session)], capture_output=True, text=True).stdout.split()
    found = set()
    for pid in out:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "aioloader-loop":
                found.add(int(pid))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_a_writer_killed_mid_fill_and_a_power_loss_serve_no_wrong_byte(
    numbered: list[str], tmp_path: Path, process: bool
) -> None:
    """A trainer fills a disk cache (slow decodes) and is killed (SIGKILL) once some entries
    exist, before all do. Then, as a power loss could: one entry is cut short, one has
    garbage appended, one has its bytes zeroed (its length intact), and temporary files of
    the dead writer and of a live one lie beside them. A new run delivers exactly the
    batches of a run without a cache, counts the three damaged entries as rejected and
    writes them again (replaced, not counted twice in what it holds); the dead writer's
    temporary file is gone, the live one's kept; a third run reads nothing from the
    source."""
    folder = tmp_path / "cache"
    text = KILLED.format(paths=numbered, folder=str(folder), process=process)
    proc = start_script(tmp_path / "killed.py", text)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        writers = _loader_process_of(proc.pid) | {proc.pid}
        deadline = time.monotonic() + 60
        while len(entry_files(folder)) < 6 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)  # reaped: a zombie still counts for pgrep
        assert session_survivors(proc.pid) == []  # its workers and loader process follow it
    finally:
        kill_session(proc)
    assert proc.returncode == -signal.SIGKILL
    kept = entry_files(folder)
    assert 6 <= len(kept) < len(numbered), "the kill did not land mid-fill"
    assert all(entry_ok(p) for p in kept)  # SIGKILL: an entry is whole or absent

    cut, grown, zeroed = kept[0], kept[1], kept[2]
    os.truncate(cut, HEADER + 5)
    with open(grown, "ab") as f:
        f.write(b"\x00garbage")
    size = zeroed.stat().st_size
    with open(zeroed, "r+b") as g:
        g.seek(HEADER)
        g.write(b"\x00" * (size - HEADER))
    assert zeroed.stat().st_size == size
    sub = cut.parent
    dead = sub / f".tmp-{max(writers)}-1-{cut.name}"  # a writer gone: removed on open
    live = sub / f".tmp-{os.getpid()}-1-{cut.name}"  # this process: alive, kept
    dead.write_bytes(b"half an entry")
    live.write_bytes(b"being written")

    cache = Cache(directory=folder)
    log = tmp_path / "reads.log"
    log.touch()
    with Loader(numbered, loader_process=False, read=LoggedRead(str(log)), cache=cache, **KW) as loader:
        got = epochs(loader, 2)
        stats = loader.stats.cache
    assert got == uncached(numbered, 2)
    whole = len(kept) - 3
    assert stats is not None
    assert (stats.rejected, stats.misses, stats.hits) == (3, len(numbered) - whole, len(numbered) + whole)
    assert len(log.read_text().splitlines()) == len(numbered) - whole  # epoch 2: no read
    assert not dead.exists() and live.exists()
    live.unlink()
    assert not any(f.name.split("-")[1] in {str(w) for w in writers} for f in tmp_files(folder))
    entries = entry_files(folder)
    assert sorted(p.name for p in entries) == sorted(file_key(cache, p) for p in numbered)
    assert all(entry_ok(p) for p in entries)  # the damaged three written again
    # What it says it holds is what the folder holds: a replaced entry is not one more.
    assert (stats.entries, stats.bytes_held) == (len(entries), sum(p.stat().st_size for p in entries))

    log.write_text("")
    with Loader(numbered, loader_process=False, read=LoggedRead(str(log)), cache=cache, **KW) as loader:
        again = epochs(loader, 1)
        stats = loader.stats.cache
    assert again == got[:1]
    assert log.read_text() == ""
    assert stats is not None and (stats.rejected, stats.hits) == (0, len(numbered))


# -- a memory cache goes with its loader ---------------------------------------------------------


def _regions(pid: int | str) -> int:
    """The memory cache's regions mapped in process ``pid``: shared anonymous mappings
    (``/dev/zero (deleted)`` in its maps) of :data:`REGION` bytes."""
    n = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start == REGION and line.rstrip().endswith("/dev/zero (deleted)"):
                n += 1
    return n


def _cache_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aioloader-cache")]


@pytest.mark.parametrize("process", [True, False], ids=["process", "thread"])
def test_a_memory_cache_goes_with_its_loader(
    numbered: list[str], runtimes: RuntimeWatch, process: bool
) -> None:
    """Default runtime (a loader process): the cache's memory is mapped there, not in the
    trainer, and the process is gone after close. In-process: the cache's threads run here
    while it loads, and after close neither they nor its memory remain."""
    runtimes.expect(process)
    here = _regions("self")
    kw: dict[str, Any] = {} if process else {"loader_process": False}
    with Loader(numbered, cache=Cache(), **kw, **KW) as loader:
        every = list(range(len(numbered)))
        assert [sorted(v for b in e for v in b) for e in epochs(loader, 2)] == [every, every]
        if process:
            (pid,) = named("aioloader-loop")
            assert _regions(pid) >= 1 and _regions("self") == here
        else:
            assert _cache_threads() != [] and _regions("self") == here + 1
        stats = loader.stats.cache
    assert stats is not None and stats.epoch_hits == len(numbered)
    assert _cache_threads() == [] and _regions("self") == here
    if process:
        deadline = time.monotonic() + 10
        while not is_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert is_gone(pid)


# -- a cgroup memory limit ------------------------------------------------------------------------

#: The cgroup's limit. Not less: importing torch takes 144 MiB, and a loader's processes
#: (the zygote, a worker, a loader process) bring the peak to about 290 MiB here.
LIMIT = 512 << 20

LIMITED = """
from helpers import decode_number
from aioloader import Cache, Loader
from aioloader.base.cgmemory import available_memory

paths = {paths!r}
print("available", available_memory(), flush=True)
for process in (False, True):
    with Loader(paths, batch_size=4, decode=decode_number, num_workers=1, loader_process=process,
                cache=Cache()) as loader:
        assert sorted(int(v) for b in loader for v in b) == list(range(len(paths)))
        print("process" if process else "thread", loader.stats.cache.max_bytes, loader.runtime, flush=True)
"""


def _memory_hierarchy() -> tuple[int, Path]:
    """``(version, mount point)`` of a whole cgroup hierarchy with the memory controller:
    v1's ``memory`` one, else a cgroup2 mount offering ``memory``; skips where there is none."""
    with open("/proc/self/mountinfo") as f:
        lines = [line.split() for line in f]
    v2 = None
    for fields in lines:
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        root, mountpoint, fstype, superopts = fields[3], Path(fields[4]), fields[sep + 1], fields[sep + 3]
        if root != "/":
            continue
        if fstype == "cgroup" and "memory" in superopts.split(","):
            return 1, mountpoint
        if fstype == "cgroup2" and v2 is None:
            with contextlib.suppress(OSError):
                if "memory" in (mountpoint / "cgroup.controllers").read_text().split():
                    v2 = mountpoint
    if v2 is None:
        pytest.skip("no cgroup hierarchy (v1 memory, or v2 offering memory) is mounted whole here")
    return 2, v2


@contextlib.contextmanager
def memory_limit(limit: int) -> Iterator[Path]:
    """A new cgroup whose memory is limited to ``limit`` bytes; removed on the way out."""
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups are Linux's")
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    version, mount = _memory_hierarchy()
    group = mount / f"aioloader-test-mem-{os.getpid()}"
    try:
        if version == 2:
            enabled = (mount / "cgroup.subtree_control").read_text().split()
            if "memory" not in enabled:  # left enabled: other cgroups may rely on it by now
                (mount / "cgroup.subtree_control").write_text("+memory")
        group.mkdir()
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a cgroup with a memory limit in {mount}: {exc}")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 10
        while group.exists():
            try:
                group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                if time.monotonic() > deadline - 5:  # only this test's processes joined it
                    for pid in (group / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)


@pytest.mark.slow
def test_a_cgroup_memory_limit_bounds_the_default_memory_cache(numbered: list[str], tmp_path: Path) -> None:
    """A trainer moved into a cgroup limited to 512 MiB (as a host's service manager or a
    job scheduler does, cgroup v1 or v2) sees at most that much memory, and ``Cache()``'s
    default bound is a quarter of what is left, in-process and in its loader process
    (which the cgroup holds too)."""
    script = tmp_path / "limited.py"
    script.write_text(LIMITED.format(paths=numbered))
    with memory_limit(LIMIT) as group:
        exe = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
        outer = f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))} || exit 75; {exe}"
        proc = subprocess.Popen(
            ["sh", "-c", outer],
            env=script_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        out, err = finish_script(proc, timeout=120)
    if proc.returncode == 75:
        pytest.skip(f"cannot move a process into a cgroup: {err.strip()}")
    assert proc.returncode == 0, f"{proc.returncode}\n{out}\n{err}"
    got = {name: rest.split() for name, rest in (line.split(" ", 1) for line in out.splitlines())}
    assert got["available"][0] != "None" and int(got["available"][0]) <= LIMIT
    assert got["thread"][1:] == ["thread"] and got["process"][1:] == ["process"]
    assert 0 < int(got["thread"][0]) <= LIMIT // 4
    assert 0 < int(got["process"][0]) <= LIMIT // 4


def test_a_v1_memory_limit_is_read_in_the_memory_hierarchy(tmp_path: Path) -> None:
    """Pure, on a tree laid out in ``tmp_path`` (so on any host): on cgroup v1 the memory
    controller is a hierarchy of its own, apart from ``cpu``; the room left is read there,
    on the process's own memory cgroup and its ancestors (the tightest binds)."""
    mountinfo = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text("4:memory:/job/step\n2:cpu,cpuacct:/job\n0::/\n")
    files = {
        "sys/fs/cgroup/memory/job/step/memory.limit_in_bytes": str(LIMIT),
        "sys/fs/cgroup/memory/job/step/memory.usage_in_bytes": str(100 << 20),
        "sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(2 * LIMIT),
        "sys/fs/cgroup/memory/job/memory.usage_in_bytes": str(300 << 20),
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(9223372036854771712),  # no limit
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(8 << 30),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_room(proc, root=tmp_path) == LIMIT - (100 << 20)

"""The shared-memory slab path: workers decode into batch slabs that become the batch
tensors without a copy. Slabs are memfd segments, reached by descriptor (``/dev/shm`` files
with ``AIOLOADER_SLABS=devshm``). The autouse ``no_leaks`` fixture also fails any test that
leaves an ``aioloader-*`` segment in /dev/shm, a memfd slab's descriptor open or a slab
mapped.

A loader whose slabs a test reads here (this process's names and mappings, the environment
and the functions it patches here) runs in-process, ``loader_process=False``; a loader
process's slabs are test_loader_process.py's."""

from __future__ import annotations

import errno
import gc
import mmap
import multiprocessing
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    FixedShape,
    decode_head,
    memfd_slabs,
    named,
    shm_mapping,
    shm_segments,
    slab_mappings,
    write_sized_files,
)

import aioloader
from aioloader import FileDataset, Loader, LoaderError
from aioloader.base.items import Failure
from aioloader.decode import worker as _worker
from aioloader.decode.chunk import Chunk
from aioloader.memory import segments
from aioloader.memory.layout import SampleLayout
from aioloader.memory.lifecycle import MOVES, SlabMoveError, SlabState
from aioloader.memory.results import Failed
from aioloader.memory.segments import ENV, SegmentGone, attach
from aioloader.memory.slabs import IDLE_TAKES, SlabPool, shm_available
from aioloader.observe.stats import Counters
from aioloader.plan.sampler import plan_epoch
from aioloader.run import wire
from aioloader.run.messages import BatchMsg
from aioloader.run.procruntime import _Channel

pytestmark = pytest.mark.skipif(not shm_available(), reason="needs shared memory (memfd or /dev/shm)")


def test_slab_batches_are_views_of_shared_memory(numbered: list[str]) -> None:
    kw = {"decode": FixedShape(), "num_workers": 2, "loader_process": False}
    with Loader(numbered, batch_size=5, shuffle=False, **kw) as loader:
        batches = list(loader)
        live = shm_segments()
        assert len(live) >= 1
        # Each batch's memory is one of this process's memfd slabs: no copy, no /dev/shm.
        assert all(shm_mapping(b) in live for b in batches)
        assert memfd_slabs() == live
    values = [int(v) for b in batches for v in b[:, 0, 0]]
    assert values == list(range(37))
    assert batches[0].shape == (5, 2, 3) and batches[0].dtype == torch.uint8
    # The slabs are closed at close even though these tensors still map them (before Python
    # 3.13 each mapping keeps a descriptor of its own), and the tensors stay valid.
    assert all(shm_mapping(b) in live for b in batches)
    assert int(batches[3][0, 1, 2]) == 15
    del batches
    gc.collect()
    assert shm_segments() == set() and not slab_mappings()  # nothing once no batch is held


def test_held_batches_never_change_and_the_pool_recycles(numbered: list[str]) -> None:
    paths = numbered * 4  # 148 samples, 30 batches: far more than the pooled slabs
    kw = {"decode": FixedShape(), "num_workers": 2, "prefetch": 1, "loader_process": False}
    with Loader(paths, batch_size=5, shuffle=False, **kw) as loader:
        held = list(loader)  # every batch kept: the pool must not reuse their slabs
        held_in = {shm_mapping(b) for b in held}
        assert None not in held_in and len(held_in) == len(held)  # a segment each
        assert held_in <= shm_segments()
        snapshot = [b.clone() for b in held]
        list(loader)  # another epoch while the first one is still held
        assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))
        del held, snapshot
        gc.collect()
        pooled = shm_segments()  # the bounded pools of slabs and of input arenas
        assert held_in - pooled  # one-shot slabs went away
        seen: set[str | None] = set()
        for b in loader:  # batches dropped as we go: slabs are recycled, none made
            seen.add(shm_mapping(b))
            seen |= shm_segments()
        assert seen <= pooled
        assert shm_segments() <= pooled


def test_zero_copy_off_returns_owned_batches(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=5,
        shuffle=False,
        decode=FixedShape(),
        num_workers=1,
        zero_copy=False,
        loader_process=False,
    ) as loader:
        held = [b for _ in range(5) for b in loader]
        assert all(shm_mapping(b) is None for b in held)  # copies, in memory of their own
        assert len(shm_segments()) < len(held)  # so holding them pins no slab: the pool stays bounded
    assert [int(v) for b in held[:8] for v in b[:, 0, 0]] == list(range(37))


def test_samples_that_do_not_fit_fall_back_to_pickle(numbered: list[str]) -> None:
    """A sample whose shape is not the declared one comes back pickled; with a custom
    collate the batch is still built."""

    def flat(samples: list[np.ndarray]) -> list[int]:
        return [int(s.reshape(-1)[0]) for s in samples]

    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(frozenset({7})), num_workers=1
    ) as loader:
        it = iter(loader)
        assert next(it).shape == (5, 2, 3)
        with pytest.raises(LoaderError, match="collate failed for batch 1"):
            next(it)  # default collate cannot stack (4,) with (2, 3): a clear error
    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(frozenset({7})), collate=flat, num_workers=1
    ) as loader:
        assert [v for b in loader for v in b] == list(range(37))


def test_files_larger_than_the_arena_still_load(tmp_path: Path) -> None:
    sizes = [3_000_000, 100, 5_000_000, 50_000, 2_000_000, 20]
    paths = write_sized_files(tmp_path / "sized", sizes)
    with Loader(paths, batch_size=2, shuffle=False, decode=decode_head, num_workers=2) as loader:
        for _ in range(2):  # the second epoch runs with arenas grown to the sizes seen
            rows = [tuple(r.tolist()) for b in loader for r in b]
            assert rows == [(i, s) for i, s in enumerate(sizes)]


def test_images_through_slabs_match_in_process_decode(image_folder: Path) -> None:
    """Each sample of a shuffled epoch is the decode of its own file, in the order the
    sampler gives that epoch, with that file's label: no sample twice, none missing."""
    ds = FileDataset.from_folder(image_folder)
    decoder = aioloader.ImageDecoder(24)
    with Loader(ds, batch_size=8, shuffle=True, seed=11, decode=decoder, num_workers=2) as loader:
        loader.set_epoch(3)
        batches = list(loader)
    plan = plan_epoch(len(ds), batch_size=8, shuffle=True, seed=11, epoch=3, drop_last=False)
    order = plan.indices.tolist()
    assert sorted(order) == list(range(len(ds))) and order != sorted(order)  # every file, shuffled
    expected = [decoder(Path(ds.path(i)).read_bytes()) for i in range(len(ds))]
    which = {e.tobytes(): i for i, e in enumerate(expected)}
    assert len(which) == len(ds)  # no two files decode alike: an image names its file
    assert [len(b[0]) for b in batches] == [len(plan.batch(k)) for k in range(len(plan))]
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    assert images.shape[1:] == expected[0].shape and images.numpy().dtype == expected[0].dtype
    # The file each delivered image is the decode of, position by position.
    assert [which.get(img.numpy().tobytes()) for img in images] == order
    assert labels.tolist() == [ds.label(i) for i in order]
    assert len(set(labels.tolist())) == 3  # all three classes, so a label mix-up shows


def test_shared_memory_exhaustion_is_a_clear_error(
    numbered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv(ENV, "devshm")  # read when the pool is made: here, in this process
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with (
        Loader(numbered, batch_size=5, decode=FixedShape(), num_workers=1, loader_process=False) as loader,
        pytest.raises(LoaderError, match=r"cannot allocate a .* MiB shared-memory batch slab in /dev/shm"),
    ):
        list(loader)
    assert shm_segments() == set()


def test_segments_are_gone_after_errors_and_gc(numbered: list[str], tmp_path: Path) -> None:
    bad = [*numbered[:6], str(tmp_path / "missing")]
    loader = Loader(bad, batch_size=3, decode=FixedShape(), num_workers=1, loader_process=False)
    with pytest.raises(aioloader.ReadError):
        list(loader)
    assert shm_segments()
    del loader
    gc.collect()
    assert shm_segments() == set()


def test_every_slab_keeps_the_written_lifecycle() -> None:
    """aioloader/memory/lifecycle.py: taken -> out (views handed out) -> free once the last
    view is garbage -> taken again; a tainted slab is closed, never free; a move the contract
    does not list (handing out twice, handing out a free slab) raises where it happens."""
    pool = SlabPool(4, pooled=2, sample=SampleLayout.declared((3,)))
    try:
        slab = pool.acquire()
        assert slab.state is SlabState.TAKEN
        owner = slab.owner(pool.release)
        assert slab.state is SlabState.OUT
        with pytest.raises(SlabMoveError, match="out -> out"):
            slab.owner(pool.release)
        del owner
        gc.collect()
        assert slab.state is SlabState.FREE
        with pytest.raises(SlabMoveError, match="free -> out"):
            slab.owner(pool.release)
        assert pool.acquire() is slab and slab.state is SlabState.TAKEN
        slab.tainted = True
        pool.release(slab)
        assert slab.state is SlabState.CLOSED and slab.closed
        assert pool.acquire() is not slab
    finally:
        pool.close()
    assert all(to in MOVES[now] for now, to in [(s, SlabState.CLOSED) for s in SlabState])
    assert MOVES[SlabState.CLOSED] == {SlabState.CLOSED}  # never reused


def test_pool_unit_bounded_reuse() -> None:
    pool = SlabPool(4, pooled=2, sample=SampleLayout.declared((3,)))
    try:
        pool.want(SampleLayout.declared((3,)), in_size=1024, out_size=0)
        a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
        assert (a.pooled, b.pooled, c.pooled) == (True, True, False)
        assert pool.live == 3
        pool.release(c)  # one-shot: closed at once
        assert pool.live == 2 and c.closed
        with pytest.raises(SegmentGone):
            attach(c.handle)  # no other process can map it any more
        pool.release(a)
        pool.release(a)  # a second release of a free slab changes nothing
        assert pool.acquire() is a  # pooled: reused
        pool.want(SampleLayout.declared((3,)), in_size=4096, out_size=0)
        pool.release(b)
        d = pool.acquire()  # b's arena is too small now: replaced
        assert d is not b and d.layout.input_size == 4096 and b.closed
        pool.want(SampleLayout.declared((5,)), in_size=4096, out_size=100)
        pool.release(d)
        e = pool.acquire()  # a new sample layout: rows blocks of another size
        assert e is not d and e.layout.sample == SampleLayout.declared((5,)) and e.layout.out_size == 100
        pool.want(SampleLayout.declared((5,)), in_size=1 << 20, out_size=100)
        pool.release(e)
        f = pool.acquire()
        pool.want(SampleLayout.declared((5,)), in_size=900_000, out_size=100)
        pool.release(f)
        assert pool.acquire() is f  # a little roomier than needed: kept
        pool.want(SampleLayout.declared((5,)), in_size=300_000, out_size=100)
        pool.release(f)
        g = pool.acquire()  # files far smaller than the arena was made for: replaced
        assert g is not f and f.closed and g.layout.input_size == 300_000
    finally:
        pool.close()
    del a, b, c, d, e, f, g  # their mappings (before Python 3.13, a descriptor each) go with them
    gc.collect()
    assert shm_segments() == set() and not slab_mappings()


def _allocated(slab: object) -> int:
    """Bytes of ``slab``'s segment the system holds now (its memfd's allocated blocks)."""
    fd = slab._segment._fd  # type: ignore[attr-defined]
    return os.fstat(fd).st_blocks * 512


def test_a_slab_left_idle_gives_its_pages_back_and_is_whole_again_when_taken() -> None:
    """``give_back``: the free list is last in, first out, so with two slabs cycling the third
    stays at its bottom; passed over by ``IDLE_TAKES`` takes, its pages go back to the system
    (the segment stays), and when a busy moment takes it again it is written and read as
    any other. A slab the trainer holds (``OUT``) is never touched, however long it is held."""
    pool = SlabPool(8, pooled=4, sample=SampleLayout.declared((4096,), np.uint8), give_back=True)
    if pool.kind != "memfd":
        pytest.skip("pages are given back for memfd slabs only")
    try:
        held_slab, idle, a, b = (pool.acquire() for _ in range(4))
        for slab in (held_slab, idle, a, b):
            slab.mmap[:] = b"\x07" * len(slab.mmap)  # every page resident
        with pytest.raises(SlabMoveError, match="given back while taken"):
            a.give_back()  # only a free slab's pages go
        held = held_slab.owner(pool.release)  # the trainer keeps this batch throughout
        pool.release(idle)
        assert _allocated(idle) >= len(idle.mmap)
        pool.release(a)
        pool.release(b)
        for _ in range(IDLE_TAKES + 1):  # two slabs cycle; ``idle`` stays at the bottom
            x = pool.acquire()
            assert x is not idle
            x.mmap[: 4096 * 8] = b"\x01" * (4096 * 8)
            pool.release(x)
        assert not idle.resident and _allocated(idle) == 0
        assert bytes(idle.mmap[:16]) == bytes(16)  # reads as zeros, the segment still there
        assert pool.live == 4 and not idle.closed
        assert held_slab.resident and bool((held == 7).all())  # out: never given back
        taken = [pool.acquire() for _ in range(3)]  # a busy moment: the idle one again
        assert idle in taken and idle.resident
        idle.mmap[:] = b"\x09" * len(idle.mmap)
        assert _allocated(idle) >= len(idle.mmap) and bytes(idle.mmap[-4:]) == b"\x09" * 4
        for slab in taken:
            pool.release(slab)
    finally:
        pool.close()
    del held, held_slab, idle, a, b, x, taken, slab
    gc.collect()
    assert shm_segments() == set() and not slab_mappings()


@pytest.mark.parametrize("why", ["no give_back", "devshm"])
def test_no_pages_given_back_where_they_must_stay(why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``give_back`` (a loader with a CUDA device: its slabs may be page-locked, and a
    page-locked slab's pages must stay the ones the device copies from), and for ``/dev/shm``
    slabs (their pages were reserved: a check against ``/dev/shm`` filling up), an idle slab
    keeps its pages."""
    if why == "devshm":
        monkeypatch.setenv(ENV, "devshm")
    pool = SlabPool(8, pooled=3, sample=SampleLayout.declared((4096,), np.uint8), give_back=why == "devshm")
    try:
        idle, a = pool.acquire(), pool.acquire()
        idle.mmap[:] = b"\x07" * len(idle.mmap)
        pool.release(idle)
        pool.release(a)
        for _ in range(2 * IDLE_TAKES):
            pool.release(pool.acquire())
        assert idle.resident and bytes(idle.mmap[-4:]) == b"\x07" * 4
    finally:
        pool.close()
    del idle, a
    gc.collect()


def test_memfd_exhaustion_is_a_clear_error_and_leaves_no_descriptor(
    numbered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memory(fd: int, length: int) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(os, "ftruncate", no_memory)
    with (
        Loader(numbered, batch_size=5, decode=FixedShape(), num_workers=1, loader_process=False) as loader,
        pytest.raises(LoaderError, match=r"cannot allocate a .* MiB shared-memory batch slab as anonymous"),
    ):
        list(loader)
    assert shm_segments() == set()


def test_devshm_fallback_slabs_are_files_and_go_at_close(
    numbered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "devshm")
    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(), num_workers=2, loader_process=False
    ) as loader:
        batches = list(loader)
        files = {n for n in os.listdir("/dev/shm") if n.startswith(f"aioloader-{os.getpid()}-")}
        assert files and memfd_slabs() == set()
        assert all(shm_mapping(b) in files for b in batches)
    assert shm_segments() == set()
    assert [int(v) for b in batches for v in b[:, 0, 0]] == list(range(37))


def test_the_tracker_never_holds_a_devshm_name_that_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``/dev/shm`` slab is registered with the resource tracker only while its name exists,
    before its pages are reserved, and unregistered before the name goes (also when reserving
    fails): a maker killed between any two steps leaves either a name the trainer finds by the
    maker's pid, or nothing; never a registration of a missing name (the tracker's "leaked"
    warning at exit) nor, with the whole tree killed, reserved memory nobody tracks."""
    seen: list[tuple[str, bool, int]] = []

    def spy(cmd: str) -> Callable[[str, str], None]:
        def record(name: str, rtype: str) -> None:
            try:
                seen.append((cmd, True, os.stat(segments.SHM_DIR + name).st_size))
            except FileNotFoundError:
                seen.append((cmd, False, -1))
            (real_register if cmd == "register" else real_unregister)(name, rtype)

        return record

    real_register, real_unregister = segments.resource_tracker.register, segments.resource_tracker.unregister
    monkeypatch.setattr(segments.resource_tracker, "register", spy("register"))
    monkeypatch.setattr(segments.resource_tracker, "unregister", spy("unregister"))
    seg = segments.Segment(f"aioloader-{os.getpid()}-0-{os.urandom(4).hex()}", 1 << 16, segments.DEVSHM)
    seg.close()
    seg.mmap.close()
    assert seen == [("register", True, 0), ("unregister", True, 1 << 16)]
    seen.clear()

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segments.os, "posix_fallocate", full)
    with pytest.raises(LoaderError, match=r"cannot allocate a .* MiB shared-memory batch slab in /dev/shm"):
        segments.Segment(f"aioloader-{os.getpid()}-1-{os.urandom(4).hex()}", 1 << 16, segments.DEVSHM)
    assert seen == [("register", True, 0), ("unregister", True, 0)]
    assert shm_segments() == set()


def test_a_bad_slab_setting_is_a_clear_error(numbered: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "tmpfs")
    with (
        pytest.raises(LoaderError, match="AIOLOADER_SLABS='tmpfs'"),
        Loader(numbered, batch_size=5, decode=FixedShape(), num_workers=1, loader_process=False) as loader,
    ):
        list(loader)


def test_a_reused_descriptor_number_is_never_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk (or a batch message) of a slab whose descriptor was closed, the number then
    reused for another file: the worker writes nothing into that file, and the trainer
    reports a LoaderError for the batch instead of mapping the wrong memory."""
    pool = SlabPool(4, pooled=0, sample=SampleLayout.declared((3,)), kind="memfd")
    monkeypatch.setattr(_worker, "_maps", OrderedDict())
    monkeypatch.setattr(_worker, "_decode", lambda data: np.zeros(3, dtype=np.uint8) + 7)
    slab = pool.acquire()
    handle, layout = slab.handle, slab.layout
    assert handle.path.startswith(f"/proc/{os.getpid()}/fd/") and handle.name == slab.name
    fd = int(handle.path.rsplit("/", 1)[1])
    pool.release(slab)  # one-shot: its descriptor is closed now
    del slab
    pool.close()
    with pytest.raises(SegmentGone):
        attach(handle)  # nothing at that number
    other = tmp_path / "other"
    other.write_bytes(bytes(layout.size))
    reused = os.open(other, os.O_RDWR)  # the number is someone else's file now
    if reused != fd:
        os.dup2(reused, fd)
        os.close(reused)
    try:
        with pytest.raises(SegmentGone, match="another file"):
            attach(handle)
        results = _worker.run_chunk(Chunk(handle, layout, [(0, 1, b"abc"), (1, 2, b"def")], 0, 0))
        assert all(isinstance(r, Failed) and "shared memory" in str(r.error) for r in results)
        assert other.read_bytes() == bytes(layout.size)  # not a byte written
        assert not _worker._maps

        parent, child = multiprocessing.Pipe()
        back_r, back_w = os.pipe()
        channel = _Channel(parent, back_w, Counters(4, 1, False), maps=4)
        try:
            m = mmap.mmap(-1, 64)
            located = [wire.Located(handle, int(np.frombuffer(m, dtype=np.uint8).ctypes.data), 64)]
            treedef, leaves, handles = wire.encode(np.frombuffer(m, dtype=np.uint8)[:8], located)
            counts = channel.counters.loader_side()
            item = channel.to_item(BatchMsg(0, 5, 4, (1,), treedef, leaves, handles, counts))
            assert isinstance(item, Failure) and isinstance(item.error, LoaderError)
            assert "batch 5: its shared memory is gone" in str(item.error)
            assert os.read(back_r, 100) == b"R " + handle.name.encode() + b"\n"  # given back
            assert not slab_mappings()
            m.close()
        finally:
            channel.close()
            child.close()
            os.close(back_r)
    finally:
        os.close(fd)


def _resident(name: str) -> int:
    """Bytes of slab ``name`` resident in this process's mappings of it (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if "-" in head[0] and len(head) >= 5 and head[0][0] in "0123456789abcdef" and ":" not in head[0]:
                path = head[5].strip() if len(head) == 6 else ""
                inside = os.path.basename(path.removeprefix("/memfd:")).removesuffix(" (deleted)") == name
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def head_rows(data: bytes) -> np.ndarray:
    """16 KiB of the file's number (``write_sized_files``), as a sample big enough to be
    handed out as a view of its slab."""
    return np.full(16384, int(data[7:13]), dtype=np.uint8)


def test_a_held_batch_keeps_no_file_bytes(tmp_path: Path) -> None:
    """A loader's batches hold their rows, not the 200 KB files they were decoded from: the
    files were read into input arenas of their own, given back once decoded, and the slab
    behind a batch the trainer holds has far less resident than the batch's files."""
    paths = write_sized_files(tmp_path / "sized", [200_000] * 64)
    kw = {"num_workers": 1, "loader_process": False, "io_concurrency": 8}
    with Loader(paths, batch_size=8, shuffle=False, decode=head_rows, **kw) as ld:
        held = [b for b in ld]  # the first two, built at once, had no layout to learn from
        name = shm_mapping(held[-1])
        assert name is not None
        assert [int(r[0]) for b in held for r in b] == list(range(64))
        assert _resident(name) < 200_000  # the rows are 128 KiB; the 8 files were 1.6 MB
    del held


def _mapped_by(pid: int) -> set[str]:
    """Names of the aioloader segments process ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as f:
        paths = [line.split(maxsplit=5)[5].strip() for line in f if "aioloader-" in line]
    return {os.path.basename(p.removeprefix("/memfd:")).removesuffix(" (deleted)") for p in paths}


def test_workers_unmap_the_slabs_the_loader_closed(numbered: list[str]) -> None:
    """Batches the trainer held past the pool's bound were one-shot slabs, closed when let
    go; the workers that decoded into them unmap them at their next tasks, so the memory is
    freed, not kept by the workers' cache of mappings."""
    kw = {"decode": FixedShape(), "num_workers": 1, "prefetch": 1, "loader_process": False}
    with Loader(numbered * 4, batch_size=5, shuffle=False, **kw) as loader:
        held = list(loader)  # 30 batches: many one-shot slabs
        one_shot = {shm_mapping(b) for b in held} - {None}
        (worker,) = named("aioloader-work")
        assert one_shot & _mapped_by(worker)  # the worker wrote them, and maps them
        del held
        gc.collect()
        closed = one_shot - shm_segments()
        assert closed  # let go of: closed by the pool
        it = iter(loader)
        for _ in range(3):  # the next tasks name them (before any cache eviction would)
            next(it)
        assert not closed & _mapped_by(worker)
        del it

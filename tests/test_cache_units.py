"""The sample cache's parts on their own, on real files and real images (no loader, no event
loop): an entry's key and its file's header, the memory and disk stores, the downscale of
``Cache(max_side=...)``, what ``Cache(...)`` and ``Loader(cache=...)`` refuse, the bound a
loader settles on, and the memory limit of a cgroup in a tree laid out in a temporary folder.
The loader-level cases, in both runtimes, are in test_cache.py."""

from __future__ import annotations

import importlib.util
import io
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import decode_number, is_gone, lay_out_proc
from PIL import Image, ImageOps

from aioloader import Cache, Loader
from aioloader.base.cgmemory import cgroup_limit, cgroup_room, mem_available
from aioloader.build import check_cache
from aioloader.cache.diskstore import BAD, DiskStore
from aioloader.cache.entries import HEADER, MAGIC, check, crc_ok, entry_key, header, relpath
from aioloader.cache.memstore import REGION, MemoryStore
from aioloader.cache.settings import FORMAT, resolved_bound
from aioloader.decode.chunk import Chunk, Shrink
from aioloader.decode.shrink import shrink, target_size
from aioloader.decode.worker import decode_chunk
from aioloader.memory.results import Pickled, Shrunk, Source
from aioloader.memory.slabs import Arena

FP = Cache().fingerprint
KEY = entry_key(FP, "/data/a.jpg", None, (11, "1700000000123456789"))


# -- entries: keys and the entry file's header -------------------------------------------------


def test_a_key_changes_with_each_thing_it_is_made_of() -> None:
    """The settings' fingerprint, the path, the span, the size and the version each give
    another key (a changed source or other settings never find the old entry)."""
    base = (FP, "/data/a.jpg", None, (11, "1700000000123456789"))
    assert entry_key(*base) == KEY and re.fullmatch(r"[0-9a-f]{32}", KEY)
    others = [
        (Cache(max_side=256).fingerprint, *base[1:]),
        (FP, "/data/b.jpg", None, base[3]),
        (FP, base[1], (0, 11), base[3]),
        (FP, base[1], (0, 5), base[3]),
        (FP, base[1], (5, 5), base[3]),
        (FP, base[1], None, (12, "1700000000123456789")),
        (FP, base[1], None, (11, "1700000000123456790")),
        (FP, base[1], None, (11, '"etag-1"')),
    ]
    keys = {entry_key(*o) for o in others}
    assert len(keys) == len(others) and KEY not in keys
    assert relpath(KEY) == f"{KEY[:2]}/{KEY}"


def test_the_fingerprint_is_what_changes_the_bytes_kept() -> None:
    """``max_side`` and ``quality`` change what is kept, so the fingerprint; the folder and
    the bound do not; the format's version is in every one."""
    fps = {Cache(max_side=256).fingerprint, Cache(max_side=256, quality=80).fingerprint, FP}
    assert len(fps) == 3 and all(fp.startswith(f"v{FORMAT}:") for fp in fps)
    assert Cache(directory="/tmp/x", max_bytes=10).fingerprint == FP
    # Without max_side, quality changes nothing: the bytes are the file's.
    assert Cache(quality=50).fingerprint == FP


def test_an_entry_header_is_checked_whole() -> None:
    """A good entry passes; a wrong magic, another key, a length that does not match the
    file's size, a header cut short and a wrong CRC are each refused."""
    data = b"the bytes of one sample " * 5
    head = header(KEY, data)
    size = HEADER + len(data)
    assert len(head) == HEADER and head.startswith(MAGIC)
    assert check(KEY, head, size) == len(data) and crc_ok(head, data)
    assert check(KEY, b"XIOLCCH\x01" + head[8:], size) is None  # magic
    assert check(KEY, head[:32] + b"0" * 32, size) is None  # another key in the header
    assert check(entry_key(FP, "/data/b.jpg", None, (11, "1")), head, size) is None  # asked for another
    assert check(KEY, head, size - 1) is None and check(KEY, head, size + 1) is None  # length vs size
    assert check(KEY, head[:40], size) is None  # the header itself cut short
    assert not crc_ok(head, data[:-1] + b"?") and not crc_ok(head, data[:-1])
    empty = header(KEY, b"")
    assert check(KEY, empty, HEADER) == 0 and crc_ok(empty, b"")


# -- the memory store ------------------------------------------------------------------------


def test_memory_store_keeps_entries_within_its_bound() -> None:
    """Entries round-trip, ``held`` is their exact size, a key held keeps its first bytes,
    and an entry past the bound is refused with nothing kept."""
    store = MemoryStore(100)
    assert store.put("a", b"a" * 30) and store.put("b", memoryview(b"b" * 20))
    assert store.get("c") is None
    assert (store.held, len(store)) == (50, 2)
    assert store.put("a", b"z" * 30)  # held already: the first bytes stay
    assert (store.held, len(store)) == (50, 2)
    assert not store.put("c", b"c" * 51)
    assert store.get("c") is None and (store.held, len(store)) == (50, 2)
    assert store.room(50) and not store.room(51)
    assert store.put("d", b"d" * 50) and store.held == 100 and not store.room()
    got = {k: bytes(v) for k in "abd" if (v := store.get(k)) is not None}
    assert got == {"a": b"a" * 30, "b": b"b" * 20, "d": b"d" * 50}
    store.close()
    assert (store.held, len(store), store.get("a")) == (0, 0, None)


def test_memory_store_gives_an_entry_larger_than_a_region_its_own() -> None:
    """An entry over the region size is kept whole in a region of its own, and the entries
    before and after it are intact."""
    store = MemoryStore(3 * REGION)
    big = bytes(range(256)) * (REGION // 256 + 1)
    assert len(big) > REGION
    assert store.put("small", b"s" * 10) and store.put("big", big) and store.put("after", b"t" * 10)
    view = store.get("big")
    assert view is not None and len(view) == len(big) and view == big
    del view
    assert bytes(store.get("small") or b"") == b"s" * 10 and bytes(store.get("after") or b"") == b"t" * 10
    assert store.held == len(big) + 20
    store.close()


# -- the disk store --------------------------------------------------------------------------


def entry_files(folder: Path) -> list[Path]:
    """Every file under a cache folder (temporary ones included)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_disk_store_writes_an_entry_and_reads_it_back(tmp_path: Path) -> None:
    """An entry put is one whole file under its sub-folder, read back as bytes, into an
    arena over a bytearray and over a mapping, or as bytes when the arena has no room."""
    folder = tmp_path / "c"
    store = DiskStore(folder, 10_000)
    store.open()
    data = b"one sample's bytes " * 7
    assert store.read(KEY, None) is None
    assert store.put(KEY, data)
    path = folder / relpath(KEY)
    assert entry_files(folder) == [path] and path.stat().st_size == HEADER + len(data)
    assert (store.held, store.entries) == (HEADER + len(data), 1)
    assert store.read(KEY, None) == data

    buf = bytearray(1000)
    arena = Arena(memoryview(buf))
    assert arena.alloc(7) == 0
    assert store.read(KEY, arena) == (7, len(data)) and bytes(buf[7 : 7 + len(data)]) == data

    m = mmap.mmap(-1, 4096)
    view = memoryview(m)
    mapped = Arena(view)
    assert store.read(KEY, mapped) == (0, len(data)) and m[: len(data)] == data
    del mapped
    view.release()
    m.close()

    small = Arena(memoryview(bytearray(10)))
    assert store.read(KEY, small) == data and small.alloc(10) == 0  # untouched

    # Put again (another rank wrote it first): nothing written, nothing counted twice.
    assert store.put(KEY, data) and (store.held, store.entries) == (HEADER + len(data), 1)


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 3)


def _cut_into_header(path: Path) -> None:
    os.truncate(path, 40)


def _flip_data(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[HEADER + 5] ^= 0x01
    path.write_bytes(bytes(raw))


def _flip_magic(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0x01
    path.write_bytes(bytes(raw))


def _grow(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"!")


@pytest.mark.parametrize("damage", [_cut, _cut_into_header, _flip_data, _flip_magic, _grow])
@pytest.mark.parametrize("into_arena", [False, True], ids=["bytes", "arena"])
def test_disk_store_reads_a_damaged_entry_as_bad(tmp_path: Path, damage: object, into_arena: bool) -> None:
    """An entry file cut short, grown, or with a byte changed in its data or header reads as
    BAD, the arena it was read into gets its room back, and the entry put again (read from
    the source) replaces it."""
    store = DiskStore(tmp_path / "c", 10_000)
    store.open()
    data = b"0123456789" * 10
    assert store.put(KEY, data)
    damage(tmp_path / "c" / relpath(KEY))  # type: ignore[operator]
    arena = Arena(memoryview(bytearray(1000))) if into_arena else None
    assert store.read(KEY, arena) == BAD
    if arena is not None:
        assert arena.alloc(1000) == 0
    assert store.put(KEY, data) and store.read(KEY, None) == data


def test_disk_store_keeps_to_its_bound(tmp_path: Path) -> None:
    """An entry that would pass ``max_bytes`` (headers counted) is refused, leaving no file
    behind, and ``held`` stays what the files hold."""
    folder = tmp_path / "c"
    entry = HEADER + 100
    store = DiskStore(folder, 2 * entry + 50)
    store.open()
    keys = [entry_key(FP, f"/data/{i}", None, (100, "1")) for i in range(3)]
    assert store.put(keys[0], b"a" * 100) and store.put(keys[1], b"b" * 100)
    assert not store.room(100) and store.room(50 - HEADER)
    assert not store.put(keys[2], b"c" * 100)
    assert store.read(keys[2], None) is None
    files = entry_files(folder)
    assert sorted(p.name for p in files) == sorted(keys[:2])
    assert store.held == sum(p.stat().st_size for p in files) == 2 * entry and store.entries == 2


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(out.stdout)
    assert is_gone(pid)
    return pid


def test_disk_store_open_counts_entries_and_removes_dead_writers_files(tmp_path: Path) -> None:
    """Opening counts the entry files already there and their bytes; a temporary file of a
    writer that is gone is removed, one of a live writer is kept; other files are ignored."""
    folder = tmp_path / "c"
    first = DiskStore(folder, 10**6)
    first.open()
    keys = [entry_key(FP, f"/data/{i}", None, (i, "1")) for i in range(1, 4)]
    for i, key in enumerate(keys, start=1):
        assert first.put(key, bytes(i * 10))
    sub = folder / keys[0][:2]
    dead = sub / f".tmp-{_dead_pid()}-123-{keys[0]}"
    live = sub / f".tmp-{os.getpid()}-456-{keys[0]}"
    dead.write_bytes(b"half an entry")
    live.write_bytes(b"half an entry")
    (folder / "README").write_text("not an entry")
    (folder / "notes").mkdir()
    (folder / "notes" / "n.txt").write_text("not an entry")

    second = DiskStore(folder, 10**6)
    second.open()
    assert second.entries == 3 and second.held == 3 * HEADER + 60 == first.held
    assert not dead.exists() and live.exists()
    assert second.read(keys[1], None) == bytes(20)


def test_disk_store_refuses_a_folder_it_cannot_write(tmp_path: Path) -> None:
    """A folder that exists but cannot be written, one that cannot be made, and a file where
    the folder would be each raise an OSError naming the path (``/proc/self``: not
    writable even by root)."""
    if os.access("/proc/self", os.W_OK):
        pytest.skip("/proc/self is writable here")
    with pytest.raises(PermissionError) as info:
        DiskStore(Path("/proc/self"), 10**6).open()
    assert info.value.filename == "/proc/self"
    with pytest.raises(OSError):
        DiskStore(Path("/proc/self/aioloader-cache"), 10**6).open()
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        DiskStore(tmp_path / "file" / "c", 10**6).open()


# -- the downscale (max_side) ------------------------------------------------------------------


def image_bytes(
    size: tuple[int, int],
    mode: str = "RGB",
    fmt: str = "JPEG",
    orientation: int | None = None,
    **save: object,
) -> bytes:
    """An image of ``size`` in ``mode``, four flat quadrants of different colours (so a turn
    shows), encoded as ``fmt``, with an EXIF orientation if given."""
    w, h = size
    colours = [(250, 10, 10, 255), (10, 250, 10, 128), (10, 10, 250, 255), (240, 240, 240, 64)]
    a = np.zeros((h, w, 4), dtype=np.uint8)
    a[: h // 2, : w // 2], a[: h // 2, w // 2 :] = colours[0], colours[1]
    a[h // 2 :, : w // 2], a[h // 2 :, w // 2 :] = colours[2], colours[3]
    img = Image.fromarray(a, "RGBA").convert(mode)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def opened(data: bytes | None) -> Image.Image:
    assert data is not None
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_target_size_keeps_the_aspect_and_never_enlarges() -> None:
    assert target_size(2048, 1536, 512) == (512, 384)
    assert target_size(1536, 2048, 512) == (384, 512)
    assert target_size(1000, 700, 512) == (512, 358)
    assert target_size(3, 3000, 10) == (1, 10)  # at least 1
    assert target_size(300, 200, 512) == (300, 200)


@pytest.mark.parametrize(("size", "want"), [((2048, 1536), (512, 384)), ((1536, 2048), (384, 512))])
def test_shrink_makes_a_smaller_jpeg(size: tuple[int, int], want: tuple[int, int]) -> None:
    """A large JPEG, landscape or portrait, comes back a baseline JPEG whose longer side is
    ``max_side``, the same picture."""
    data = image_bytes(size)
    out = shrink(data, 512, 90)
    img = opened(out)
    assert (img.format, img.size, img.mode) == ("JPEG", want, "RGB")
    reference = Image.open(io.BytesIO(data)).convert("RGB").resize(want)
    diff = np.abs(np.asarray(img, dtype=np.int16) - np.asarray(reference, dtype=np.int16))
    assert diff.mean() < 8


def test_shrink_makes_an_rgb_jpeg_of_an_rgba_png() -> None:
    img = opened(shrink(image_bytes((1000, 700), "RGBA", "PNG"), 500, 90))
    assert (img.format, img.size, img.mode) == ("JPEG", (500, 350), "RGB")


def test_shrink_keeps_a_grey_image_grey() -> None:
    for fmt in ("JPEG", "PNG"):
        img = opened(shrink(image_bytes((1000, 700), "L", fmt), 500, 90))
        assert (img.format, img.size, img.mode) == ("JPEG", (500, 350), "L")


@pytest.mark.parametrize(("max_side", "want"), [(1000, (300, 400)), (200, (150, 200))])
def test_shrink_applies_the_exif_orientation(max_side: int, want: tuple[int, int]) -> None:
    """A 400x300 JPEG tagged orientation 6 comes back upright (300x400, turned as
    ``ImageOps.exif_transpose`` turns it), without the tag: as it is in size when within
    ``max_side`` (never enlarged), smaller otherwise."""
    data = image_bytes((400, 300), orientation=6)
    img = opened(shrink(data, max_side, 90))
    assert img.size == want and img.getexif().get(0x0112, 1) == 1
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB").resize(want)
    diff = np.abs(np.asarray(img, dtype=np.int16) - np.asarray(upright, dtype=np.int16))
    assert diff.mean() < 8


def tagged_file(fmt: str, orientation: int) -> bytes:
    """A 400x300 RGB image whose top-left 80x60 corner alone is red (the rest blue), saved
    as ``fmt`` with the EXIF orientation ``orientation``: a true MPO (two frames) for MPO,
    the tag in the TIFF's own IFD for TIFF."""
    a = np.zeros((300, 400, 3), dtype=np.uint8)
    a[...] = (20, 20, 230)
    a[:60, :80] = (230, 20, 20)
    img = Image.fromarray(a, "RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    if fmt == "MPO":
        img.save(buf, fmt, exif=exif.tobytes(), save_all=True, append_images=[img])
    elif fmt == "TIFF":
        img.save(buf, fmt, tiffinfo={0x0112: orientation})
    else:
        img.save(buf, fmt, exif=exif.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orientation", [3, 6, 8])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF", "MPO"])
@pytest.mark.parametrize("max_side", [200, 1000])
def test_shrink_turns_every_format_upright_once(fmt: str, orientation: int, max_side: int) -> None:
    """Each format Pillow reads, tagged 3, 6 or 8, comes back upright: the red corner where
    ``ImageOps.exif_transpose(Image.open(...))`` of the same file puts it (it also turns a
    TIFF, whose reader applies the tag itself as it loads), the size the upright image's,
    scaled (200) or as it is (1000)."""
    data = tagged_file(fmt, orientation)
    src = Image.open(io.BytesIO(data))
    assert (src.format, src.getexif().get(0x0112)) == (fmt, orientation)  # the file is as meant
    upright = ImageOps.exif_transpose(src).convert("RGB")
    want = target_size(upright.width, upright.height, max_side)
    img = opened(shrink(data, max_side, 95))
    assert img.size == want and img.getexif().get(0x0112, 1) == 1
    reference = np.asarray(upright.resize(want), dtype=np.int16)
    got = np.asarray(img, dtype=np.int16)
    assert np.abs(got - reference).mean() < 8
    red = np.argwhere((got[..., 0] > 128) & (got[..., 2] < 128))
    red_ref = np.argwhere((reference[..., 0] > 128) & (reference[..., 2] < 128))
    assert red.size and red_ref.size
    assert np.abs(red.mean(axis=0) - red_ref.mean(axis=0)).max() < 2  # the same corner


def test_shrink_keeps_as_it_is_what_needs_nothing() -> None:
    """An image within ``max_side`` with no turn to apply (no tag, or orientation 1), a
    format that is not re-encoded, and bytes that are no image at all: None (kept as is)."""
    assert shrink(image_bytes((400, 300)), 400, 90) is None
    assert shrink(image_bytes((400, 300), orientation=1), 1000, 90) is None
    assert shrink(image_bytes((400, 300), "P", "GIF"), 100, 90) is None
    assert shrink(b"sample-000001", 100, 90) is None
    assert shrink(b"", 100, 90) is None


def test_shrink_keeps_the_icc_profile() -> None:
    cms = pytest.importorskip("PIL.ImageCms")
    icc = cms.ImageCmsProfile(cms.createProfile("sRGB")).tobytes()
    img = opened(shrink(image_bytes((800, 600), icc_profile=icc), 200, 90))
    assert img.info.get("icc_profile") == icc


def test_a_truncated_image_raises_and_the_worker_decodes_the_file_unkept() -> None:
    """An image Pillow recognises but cannot decode raises in ``shrink``; the worker then
    decodes the file as it is and keeps nothing. A good image is decoded from its small
    JPEG, which is kept; a file that is no image is decoded and kept as it is."""
    data = image_bytes((1024, 768), "RGB", "JPEG", quality=95)
    cut = data[: len(data) // 2]
    with pytest.raises(OSError):
        shrink(cut, 256, 90)
    items: list[tuple[int, int, Source]] = [(0, 0, cut), (1, 1, data), (2, 2, b"sample-000001")]
    chunk = Chunk(None, None, items, 0, 0, shrink=Shrink(256, 90, frozenset({0, 1, 2})))
    unkept, made, as_is = decode_chunk(None, chunk, bytes)  # the decode: what it received
    assert unkept == Pickled(cut)
    assert isinstance(made, Shrunk) and made.kept is not None and made.result == Pickled(made.kept)
    assert opened(made.kept).size == (256, 192)
    assert as_is == Shrunk(Pickled(b"sample-000001"), None)


# -- Cache(...) and Loader(cache=...) arguments ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "shown"),
    [
        ({"max_bytes": 0}, ValueError, "Cache(max_bytes=0)"),
        ({"max_bytes": -5}, ValueError, "Cache(max_bytes=-5)"),
        ({"max_bytes": 1.5}, ValueError, "Cache(max_bytes=1.5)"),
        ({"max_bytes": True}, ValueError, "Cache(max_bytes=True)"),
        ({"max_bytes": "1G"}, ValueError, "Cache(max_bytes='1G')"),
        ({"max_side": 0}, ValueError, "Cache(max_side=0)"),
        ({"max_side": "512"}, ValueError, "Cache(max_side='512')"),
        ({"quality": 0}, ValueError, "Cache(quality=0)"),
        ({"quality": 101}, ValueError, "Cache(quality=101)"),
        ({"quality": 90.0}, ValueError, "Cache(quality=90.0)"),
        ({"quality": None}, ValueError, "Cache(quality=None)"),
        ({"directory": 3}, TypeError, "Cache(directory=3)"),
        ({"directory": b"/tmp/c"}, TypeError, "Cache(directory=b'/tmp/c')"),
    ],
)
def test_cache_refuses_a_bad_setting(kwargs: dict[str, object], error: type[Exception], shown: str) -> None:
    """Each bad setting is refused when the Cache is made, the message naming it with its
    value."""
    with pytest.raises(error, match=re.escape(shown)):
        Cache(**kwargs)  # type: ignore[arg-type]


def test_cache_takes_good_settings() -> None:
    c = Cache(directory=Path("~/c"), max_bytes=1 << 30, max_side=512, quality=1)
    assert c.folder == Path.home() / "c" and Cache().folder is None
    assert Cache(quality=100).quality == 100


def test_loader_refuses_what_cannot_go_with_a_cache(tmp_path: Path, numbered: list[str]) -> None:
    """Not a Cache; ``max_side`` with no decode workers (``decode=None``); a folder that is a
    file. Each is refused when the loader is made, naming ``cache=`` and showing it."""
    with pytest.raises(TypeError, match=r"cache='yes' must be an aioloader\.Cache or None"):
        Loader(numbered, decode=decode_number, cache="yes")  # type: ignore[arg-type]
    small = Cache(max_side=256)
    with pytest.raises(
        ValueError, match=r"cache=Cache\(.*max_side=256.*\): max_side needs decode workers.*decode=None"
    ):
        Loader(numbered, decode=None, cache=small)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cache=Cache\(directory=.*'.*/file' is not a folder"):
        Loader(numbered, decode=decode_number, cache=Cache(directory=tmp_path / "file"))
    # The checks themselves: max_side with Ray's workers, and nothing wrong.
    with pytest.raises(
        ValueError, match=r"max_side needs decode workers of this machine, not decode_on='ray'"
    ):
        check_cache(small, decode_number, on_ray=True)
    assert check_cache(Cache(directory=tmp_path / "new" / "c"), None, on_ray=True) is not None
    assert check_cache(None, None, on_ray=False) is None


def test_loader_refuses_max_side_with_ray() -> None:
    """``decode_on="ray"`` decodes on the cluster: no worker of this machine makes the small
    images, so ``max_side`` is refused when the loader is made (Ray is not started)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: decode_on='ray' is refused before the cache is checked")
    with pytest.raises(
        ValueError, match=r"max_side needs decode workers of this machine, not decode_on='ray'"
    ):
        Loader(["a.txt"], decode=decode_number, decode_on="ray", cache=Cache(max_side=64))


def test_loader_refuses_a_cache_folder_it_cannot_write() -> None:
    """A folder under one this process cannot write (``/proc/self``: not even root can) is
    refused when the loader is made, naming the folder that is not writable."""
    if os.access("/proc/self", os.W_OK):
        pytest.skip("/proc/self is writable here")
    with pytest.raises(ValueError, match=r"cache=Cache\(.*\): '/proc/self' is not writable"):
        Loader(["a.txt"], decode=decode_number, cache=Cache(directory="/proc/self/aioloader-cache"))


def test_the_bound_a_loader_settles_on(tmp_path: Path) -> None:
    """``max_bytes`` when given; else a quarter of the memory available (1 GiB unknown) in
    memory, half the free space of the folder (made) on disk."""
    assert resolved_bound(Cache(max_bytes=123), 4000) == 123
    assert resolved_bound(Cache(), 4000) == 1000
    assert resolved_bound(Cache(), None) == 1 << 30
    assert resolved_bound(Cache(), 2) == 1
    folder = tmp_path / "a" / "c"
    assert resolved_bound(Cache(directory=folder, max_bytes=77), None) == 77 and not folder.exists()
    bound = resolved_bound(Cache(directory=folder), None)
    assert folder.is_dir() and bound >= 1


# -- the memory limit of a cgroup (cgmemory), in a tree laid out in a temporary folder ----------

#: cgroup v2 alone (Fedora), a process in a scope four levels down.
V2_MOUNTS = "26 24 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"
V2_CGROUP = "0::/user.slice/user-1000.slice/app.slice/run.scope\n"
V2_SCOPE = "/sys/fs/cgroup/user.slice/user-1000.slice/app.slice/run.scope"

#: cgroup v1 as Docker and older systemd lay it out: each controller its own hierarchy, the
#: ``memory`` one apart from ``cpu,cpuacct``.
V1_MOUNTS = (
    "33 25 0:28 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
    "35 33 0:30 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd\n"
    "38 33 0:33 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory\n"
    "39 33 0:34 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:16 - cgroup cgroup rw,cpu,cpuacct\n"
)
V1_CGROUP = "11:memory:/batch/job_7\n5:cpu,cpuacct:/batch/job_7\n1:name=systemd:/batch/job_7\n0::/\n"


def test_cgroup_v2_the_smallest_room_up_the_chain_binds(tmp_path: Path) -> None:
    """v2 ``memory.max`` minus ``memory.current`` at the process's cgroup and each ancestor:
    the smallest binds; "max" is no limit; a sibling's or a child's limit is not ours."""
    parent = V2_SCOPE.rsplit("/", 1)[0]
    slice_ = "/sys/fs/cgroup/user.slice/user-1000.slice"
    proc = lay_out_proc(
        tmp_path,
        V2_MOUNTS,
        V2_CGROUP,
        {
            f"{V2_SCOPE}/memory.max": "max\n",
            f"{V2_SCOPE}/memory.current": "1000\n",
            f"{V2_SCOPE}/inner/memory.max": "10\n",  # a child: not this process's
            f"{V2_SCOPE}/inner/memory.current": "0\n",
            f"{parent}/memory.max": "8000000\n",
            f"{parent}/memory.current": "3000000\n",  # 5 MB left
            f"{slice_}/memory.max": "9000000\n",
            f"{slice_}/memory.current": "2000000\n",  # 7 MB left: a larger room
            "/sys/fs/cgroup/system.slice/memory.max": "100\n",  # a sibling: not ours
            "/sys/fs/cgroup/system.slice/memory.current": "0\n",
        },
    )
    assert cgroup_room(proc, tmp_path) == 5_000_000
    assert cgroup_limit(proc, tmp_path) == 8_000_000  # the tightest limit, not the least room


def test_cgroup_v2_no_limit_and_usage_over_the_limit(tmp_path: Path) -> None:
    """ "max" everywhere: None; usage past the limit (the kernel reclaiming): no room, 0."""
    proc = lay_out_proc(
        tmp_path,
        V2_MOUNTS,
        V2_CGROUP,
        {f"{V2_SCOPE}/memory.max": "max\n", f"{V2_SCOPE}/memory.current": "5\n"},
    )
    assert cgroup_room(proc, tmp_path) is None
    (tmp_path / V2_SCOPE.lstrip("/") / "memory.max").write_text("4\n")
    assert cgroup_room(proc, tmp_path) == 0


def test_cgroup_v1_reads_the_memory_hierarchy(tmp_path: Path) -> None:
    """v1 ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``, in the ``memory``
    controller's own hierarchy (not the ``cpu`` one's); v1's "no limit" (a huge number) is
    none, and an ancestor's smaller room binds."""
    memory = "/sys/fs/cgroup/memory"
    proc = lay_out_proc(
        tmp_path,
        V1_MOUNTS,
        V1_CGROUP,
        {
            f"{memory}/batch/job_7/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
            f"{memory}/batch/job_7/memory.usage_in_bytes": "100\n",
            f"{memory}/batch/memory.limit_in_bytes": "4000000\n",
            f"{memory}/batch/memory.usage_in_bytes": "1500000\n",
            f"{memory}/memory.limit_in_bytes": "9223372036854771712\n",
            f"{memory}/memory.usage_in_bytes": "50000000\n",
            # The cpu hierarchy has no memory files; one put there is not read.
            "/sys/fs/cgroup/cpu,cpuacct/batch/job_7/memory.limit_in_bytes": "10\n",
            "/sys/fs/cgroup/cpu,cpuacct/batch/job_7/memory.usage_in_bytes": "0\n",
        },
    )
    assert cgroup_room(proc, tmp_path) == 2_500_000
    assert cgroup_limit(proc, tmp_path) == 4_000_000
    (tmp_path / memory.lstrip("/") / "batch" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_room(proc, tmp_path) is None


def test_cgroup_room_is_none_where_nothing_says(tmp_path: Path) -> None:
    """No limit files, or no ``/proc`` files at all: None (nothing limits)."""
    assert cgroup_room(lay_out_proc(tmp_path, V1_MOUNTS, V1_CGROUP, {}), tmp_path) is None
    assert cgroup_room(tmp_path / "nowhere", tmp_path) is None
    assert cgroup_limit(tmp_path / "nowhere", tmp_path) is None


def test_mem_available_reads_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000 kB\nMemFree:  1000 kB\nMemAvailable:    2048 kB\n")
    assert mem_available(meminfo) == 2048 * 1024
    meminfo.write_text("MemTotal:  8000 kB\n")
    assert mem_available(meminfo) is None
    assert mem_available(tmp_path / "missing") is None

"""The device decode (issue 32, parts 2-3), run without a GPU.

``ImageDecoder(device="cpu")`` runs the whole device path: the loader's stage screens each
sample and draws its window, encoded images cross to the bridging thread, which decodes the
batch with a batch decoder (here Pillow's, the same code the workers run), decodes what it
could not again, and hands the batch over. So batches must equal the CPU path's exactly:
shapes, dtype, labels, order, crop windows and pixels. The CUDA batch decoder has its own
``cuda``-marked tests (test_nvimgcodec.py and the end of this module).
"""

from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import aioloader
from aioloader import DecodeError, FileDataset, Loader, LoaderError, SampleError
from aioloader.build import check_device_decode
from aioloader.collate import default_collate
from aioloader.decode.encoded import EncodedBatch, EncodedImage
from aioloader.decode.hybrid import HybridShare
from aioloader.decode.jpeg import JpegHeader, jpeg_complete, jpeg_header, not_on_device
from aioloader.decode.ondevice import loaderside
from aioloader.synthetic import make_image, make_image_folder

RUNTIMES = pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])


def encode(img: Image.Image, fmt: str = "JPEG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 JPEGs in 3 classes, with files the device cannot take among them: a PNG, a CMYK
    JPEG, a progressive one (it can) and a grey one (it can)."""
    root = make_image_folder(tmp_path_factory.mktemp("devdec"), num_images=48, num_classes=3, size=(96, 72))
    rng = np.random.default_rng(1)
    (root / "class_00" / "zz_png.png").write_bytes(encode(make_image(rng, 80, 60), "PNG"))
    (root / "class_01" / "zz_cmyk.jpg").write_bytes(encode(make_image(rng, 80, 60).convert("CMYK")))
    (root / "class_01" / "zz_progressive.jpg").write_bytes(encode(make_image(rng, 80, 60), progressive=True))
    (root / "class_02" / "zz_grey.jpg").write_bytes(encode(make_image(rng, 80, 60).convert("L")))
    return root


def load(folder: Path, decoder: aioloader.ImageDecoder, **kw: Any) -> tuple[list[Any], Any]:
    ds = FileDataset.from_folder(folder)
    with Loader(ds, batch_size=8, decode=decoder, num_workers=2, shuffle=True, seed=11, **kw) as loader:
        batches = list(loader)
        return batches, loader.stats


def decoder(device: str | None) -> aioloader.ImageDecoder:
    return aioloader.ImageDecoder(40, crop="random", hflip=True, device=device)


def same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected) > 1
    for (x, y), (xe, ye) in zip(got, expected, strict=True):
        assert x.dtype == torch.uint8 and x.shape == xe.shape and y.dtype == torch.int64
        assert torch.equal(y, ye)
        assert torch.equal(x, xe)


@RUNTIMES
def test_batches_equal_the_cpu_paths(mixed: Path, loader_process: bool) -> None:
    expected, _ = load(mixed, decoder(None), loader_process=loader_process)
    got, stats = load(mixed, decoder("cpu"), loader_process=loader_process)
    same(got, expected)
    dd = stats.device_decode
    assert dd is not None
    assert dd.gpu + dd.cpu == stats.samples == 52
    assert dd.gpu > 0
    # The PNG and the CMYK JPEG went to the workers, by reason; grey and progressive did not.
    assert dd.fallbacks == {"not a JPEG": 1, "JPEG with 4 components": 1}
    assert dd.gpu_seconds > 0


def test_idle_workers_take_a_measured_share(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers are idle while the bridge decodes (here on one thread): their share
    grows at each adjustment, and the batches stay the same."""
    monkeypatch.setattr(loaderside, "HybridShare", lambda: HybridShare(step=0.25, interval=0.0))
    expected, _ = load(mixed, decoder(None), loader_process=False)
    got, stats = load(mixed, decoder("cpu"), loader_process=False)
    same(got, expected)
    dd = stats.device_decode
    assert dd is not None and dd.share > 0
    assert dd.cpu > 2 and dd.gpu > 0  # more than the two fallbacks went to the workers


@RUNTIMES
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_jpeg_cut_short_fails_as_on_the_cpu(tmp_path: Path, on_error: str, loader_process: bool) -> None:
    """Its header passes the screening, its end does not: the CPU workers take it and fail
    it as any corrupt file (nvJPEG would decode it without an error): with "raise" a
    DecodeError naming it; with "skip" its row is left out, labels too."""
    root = make_image_folder(tmp_path / "cut", num_images=16, num_classes=2, size=(96, 72))
    bad = root / "class_01" / "img_000003.jpg"
    bad.write_bytes(bad.read_bytes()[:400])
    assert jpeg_header(bad.read_bytes()) is not None and not jpeg_complete(bad.read_bytes())
    if on_error == "raise":
        with pytest.raises(DecodeError, match="img_000003"):
            load(root, decoder("cpu"), loader_process=loader_process)
        return
    expected, _ = load(root, decoder(None), on_error="skip", loader_process=loader_process)
    got, stats = load(root, decoder("cpu"), on_error="skip", loader_process=loader_process)
    same(got, expected)
    assert sum(len(y) for _, y in got) == 15
    assert stats.device_decode is not None and stats.failures == 1
    assert stats.device_decode.fallbacks == {"JPEG without its end": 1}


@RUNTIMES
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_jpeg_the_screening_passes_but_neither_decodes(
    tmp_path: Path, on_error: str, loader_process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut short and given an end marker, it passes the screening and reaches the bridge;
    neither decoder can decode it: with "raise" a DecodeError naming it; with "skip" its row
    is left out, labels too."""
    root, bad = undecodable_on_the_bridge(tmp_path, 16)
    if on_error == "raise":
        with pytest.raises(DecodeError, match="img_000003"):
            load(root, decoder("cpu"), loader_process=loader_process)
        return
    expected, _ = load(root, decoder(None), on_error="skip", loader_process=loader_process)
    caplog.clear()
    got, stats = load(root, decoder("cpu"), on_error="skip", loader_process=loader_process)
    same(got, expected)
    assert sum(len(y) for _, y in got) == 15
    assert stats.device_decode is not None
    assert stats.device_decode.fallbacks.get("undecodable, skipped") == 1
    # Judged by the loader's failure policy, as a sample the CPU workers fail.
    assert (stats.failures, stats.failures_by_reason) == (1, {"DecodeError": 1})
    assert stats.last_failed_paths == (str(bad),)
    warned = [
        r.getMessage() for r in caplog.records if r.name == "aioloader" and r.levelno == logging.WARNING
    ]
    assert len(warned) == 1 and warned[0].startswith("skipped ") and warned[0].count(str(bad)) == 1


def undecodable_on_the_bridge(
    tmp_path: Path, num_images: int, name: str = "class_01/img_000003.jpg"
) -> tuple[Path, Path]:
    """A folder with one JPEG, ``name``, cut short and given an end marker: it passes the
    screening, and neither the batch decoder nor Pillow decodes it."""
    root = make_image_folder(tmp_path / "cut", num_images=num_images, num_classes=2, size=(48, 36))
    bad = root / name
    bad.write_bytes(bad.read_bytes()[:400] + b"\xff\xd9")
    assert not_on_device(jpeg_header(bad.read_bytes()), complete=jpeg_complete(bad.read_bytes())) is None
    return root, bad


@RUNTIMES
@pytest.mark.parametrize("limit", [0, 0.005])
def test_max_failures_judges_what_the_bridge_skips(
    tmp_path: Path, limit: float, loader_process: bool
) -> None:
    """A count is judged at the failure; a fraction also at the epoch's end (the loader's
    side has finished the epoch before the bridge decodes its last batches)."""
    root, _ = undecodable_on_the_bridge(tmp_path, 104)
    kw: dict[str, Any] = {"on_error": "skip", "max_failures": limit, "loader_process": loader_process}
    with pytest.raises(LoaderError, match="too many failed samples: 1 of") as info:
        load(root, decoder("cpu"), **kw)
    assert not isinstance(info.value, SampleError)


@RUNTIMES
def test_a_fraction_is_judged_at_the_epoch_end(tmp_path: Path, loader_process: bool) -> None:
    """The first sample fails on the bridge while fewer than 100 were attempted, none after
    it: the fraction is judged when 100 were (in this process), or at the epoch's end,
    counting it (a loader process has ended its epoch without knowing of it)."""
    root, _ = undecodable_on_the_bridge(tmp_path, 104, "class_00/img_000000.jpg")
    ds = FileDataset.from_folder(root)
    kw: dict[str, Any] = {"on_error": "skip", "max_failures": 0.005, "loader_process": loader_process}
    got = []
    with Loader(
        ds, batch_size=8, decode=decoder("cpu"), shuffle=False, io_concurrency=1, prefetch=1, **kw
    ) as loader:
        it = iter(loader)
        got.append(next(it))
        assert loader.stats.failures == 1 and loader.stats.attempted < 100
        with pytest.raises(LoaderError, match=r"too many failed samples: 1 of 10[04] attempted"):
            got.extend(it)
    assert len(got[0][1]) == 7 and sum(len(y) for _, y in got) <= 103


def test_resume_mid_epoch(mixed: Path) -> None:
    ds = FileDataset.from_folder(mixed)
    kw: dict[str, Any] = {"batch_size": 8, "decode": decoder("cpu"), "num_workers": 2, "seed": 4}
    with Loader(ds, **kw) as loader:
        it = iter(loader)
        next(it)
        next(it)
        state = loader.state_dict()
        rest = list(it)
    with Loader(ds, **kw) as again:
        again.load_state_dict(state)
        resumed = list(again)
    same(resumed, rest)


def test_arguments_are_checked_early(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="device='tpu'"):
        aioloader.ImageDecoder(32, device="tpu")
    ds = FileDataset.from_folder(mixed)
    # Whether this machine has a GPU or not, each case is made by what torch answers.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="loader's is 'cpu'"):
        Loader(ds, decode=aioloader.ImageDecoder(32, device="cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"on a CUDA GPU, but this machine has none \(torch.cuda.is_available\(\)"
    ):
        Loader(ds, decode=aioloader.ImageDecoder(32, device="cuda"))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="default collate"):
        Loader(ds, decode=decoder("cpu"), collate=lambda s: s)
    cuda = torch.device("cuda", 0)
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"aioloader\[gpu\]"):
            check_device_decode(aioloader.ImageDecoder(32, device="cuda"), cuda, None, False)
    with pytest.raises(ValueError, match="decode_on='ray'"):
        check_device_decode(aioloader.ImageDecoder(32, device="cuda"), cuda, None, True)


# -- the pure parts --------------------------------------------------------------------------


def test_jpeg_header_reads_the_frame_header() -> None:
    rng = np.random.default_rng(0)
    img = make_image(rng, 70, 50)
    assert jpeg_header(encode(img)) == JpegHeader(0, 8, 50, 70, 3)
    assert jpeg_header(encode(img, progressive=True)) == JpegHeader(2, 8, 50, 70, 3)
    assert jpeg_header(encode(img.convert("L"))) == JpegHeader(0, 8, 50, 70, 1)
    assert jpeg_header(encode(img.convert("CMYK"))) == JpegHeader(0, 8, 50, 70, 4)
    with_exif = encode(img, exif=Image.Exif(), comment=b"x" * 3000)
    assert jpeg_header(with_exif) == JpegHeader(0, 8, 50, 70, 3)
    for not_one in (encode(img, "PNG"), b"", b"\xff\xd8", b"\xff\xd8\xff\xda\x00\x02", encode(img)[:20]):
        assert jpeg_header(not_one) is None


def test_not_on_device_says_why() -> None:
    assert not_on_device(None) == "not a JPEG"
    assert not_on_device(JpegHeader(0, 8, 10, 10, 3)) is None
    assert not_on_device(JpegHeader(2, 8, 10, 10, 1)) is None
    assert not_on_device(JpegHeader(2, 8, 10, 10, 3), progressive=False) == "JPEG coding SOF2"
    assert not_on_device(JpegHeader(3, 8, 10, 10, 3)) == "JPEG coding SOF3"
    assert not_on_device(JpegHeader(1, 12, 10, 10, 3)) == "12-bit JPEG"
    assert not_on_device(JpegHeader(0, 8, 10, 10, 4)) == "JPEG with 4 components"
    assert not_on_device(JpegHeader(0, 8, 10, 10, 3), complete=False) == "JPEG without its end"
    assert not_on_device(None, complete=False) == "not a JPEG"


@pytest.mark.parametrize("kind", ["baseline", "progressive", "grey", "exif"])
def test_jpeg_complete_wants_the_end_marker(kind: str) -> None:
    """Real JPEGs (Pillow's): whole, with padding after EOI (zeros, FF), as bytes or a view
    of a larger buffer; cut at any point (in the header, the scan, one or two bytes short),
    or with data after EOI, not."""
    img = make_image(np.random.default_rng(2), 120, 90)
    kw: dict[str, Any] = {"quality": 90}
    if kind == "progressive":
        kw["progressive"] = True
    elif kind == "grey":
        img = img.convert("L")
    elif kind == "exif":
        kw["exif"] = Image.Exif()  # an APP1 segment before the frame header
    data = encode(img, **kw)
    assert data.endswith(b"\xff\xd9") and jpeg_complete(data)
    for padded in (data + b"\x00", data + b"\x00" * 4096, data + b"\xff" * 3, data + b"\x00\xff\x00"):
        assert jpeg_complete(padded) and jpeg_complete(memoryview(b"x" + padded)[1:])
    for cut in (2, 100, 400, len(data) // 2, len(data) - 100, len(data) - 2, len(data) - 1):
        assert not jpeg_complete(data[:cut]), cut
        assert not jpeg_complete(data[:cut] + b"\x00" * 16), cut
        assert not jpeg_complete(memoryview(data)[:cut]), cut
        assert not_on_device(jpeg_header(data[:cut]), complete=jpeg_complete(data[:cut])) is not None
    for after in (b"x", b"\xff\xd9\x01", b"\x00\x00ftypmp42"):
        assert not jpeg_complete(data + after)
    for tiny in (b"", b"\xd9", b"\x00", b"\xff", b"\x00\x00"):
        assert not jpeg_complete(tiny)


def test_hybrid_share_follows_the_workers_utilization() -> None:
    share = HybridShare(step=0.1, low=0.8, high=0.95, most=0.5, interval=1.0)
    assert not share.due(0.0) and not share.due(0.5) and share.due(1.0)
    assert share.observe(0.2, 1.0) == pytest.approx(0.1)  # idle: more for the workers
    for t in range(2, 10):
        share.observe(0.0, float(t))
    assert share.share == pytest.approx(0.5)  # never above `most`
    assert share.observe(0.9, 10.0) == pytest.approx(0.5)  # busy enough: stays
    assert share.observe(1.0, 11.0) == pytest.approx(0.4)  # saturated: less
    assert share.cpu_count(10) == 4 and share.cpu_count(0) == 0 and share.cpu_count(1) == 0


def test_encoded_batch_from_a_mixed_column() -> None:
    a, b = b"\xff\xd8first", b"\xff\xd8second!"
    row = np.full((3, 4, 5), 7, dtype=np.uint8)
    column = [
        EncodedImage(a, (0.0, 0.0, 5.0, 4.0), False, 10, "a.jpg", 4, 5, (4, 5), "bilinear"),
        row,
        EncodedImage(b, (1.0, 1.0, 3.0, 3.0), True, 12, "b.jpg", 4, 5, (6, 7), "bilinear"),
    ]
    batch = default_collate([(s, i) for i, s in enumerate(column)])
    eb, labels = batch
    assert isinstance(eb, EncodedBatch) and labels.tolist() == [0, 1, 2]
    assert eb.rows == 3 and (eb.height, eb.width) == (4, 5)
    assert eb.cpu_rows.tolist() == [1] and np.array_equal(eb.images[0], row)
    assert eb.gpu_rows.tolist() == [0, 2] and eb.indices.tolist() == [10, 12]
    assert bytes(eb.encoded(0)) == a and bytes(eb.encoded(1)) == b
    assert eb.flips.tolist() == [False, True] and eb.box(1) == (1.0, 1.0, 3.0, 3.0)
    assert eb.paths == ("a.jpg", "b.jpg")
    # the resize's plan, made here: sizes, each axis's taps (out, K) per image, flips folded
    assert eb.sizes.tolist() == [[4, 5], [6, 7]] and eb.across_first == 2
    assert eb.xcoef.shape[:2] == (2, 5) and eb.ycoef.shape[:2] == (2, 4)
    assert (eb.xcoef.sum(-1) == 1 << 22).all() and (eb.ycoef.sum(-1) == 1 << 22).all()
    assert eb.xindex[1, 0].max() >= eb.xindex[1, -1].max()  # flipped: right to left
    with pytest.raises(ValueError, match="row 1"):
        EncodedBatch.of([column[0], np.zeros((3, 2, 2), dtype=np.uint8)])


def test_the_window_is_the_workers() -> None:
    """The stage draws each window from ``(seed, epoch, index)`` as a worker's sample_rng."""
    dec = decoder(None)
    from aioloader.decode import worker

    worker._local.context, worker._local.rng = (3, 1, 17), None
    try:
        in_worker = dec.window(96, 72, aioloader.sample_rng)
    finally:
        worker._local.context, worker._local.rng = None, None
    assert dec.window(96, 72, lambda: loaderside.sample_generator(3, 1, 17)) == in_worker


# -- CUDA only -------------------------------------------------------------------------------


@RUNTIMES
@pytest.mark.cuda
def test_cuda_batches_match_the_cpu_paths(mixed: Path, loader_process: bool) -> None:
    """On the GPU (nvImageCodec): the same shapes, dtype, labels, order and windows as the
    CPU path; pixels within the rounding of two IDCTs and resamplers."""
    pytest.importorskip("nvidia.nvimgcodec")
    kw: dict[str, Any] = {"crop": "random", "hflip": True, "draft": False}
    expected, _ = load(mixed, aioloader.ImageDecoder(40, **kw), loader_process=loader_process)
    got, stats = load(
        mixed, aioloader.ImageDecoder(40, device="cuda", **kw), device="cuda", loader_process=loader_process
    )
    assert len(got) == len(expected)
    for (x, y), (xe, ye) in zip(got, expected, strict=True):
        assert x.device.type == "cuda" and x.dtype == torch.uint8 and x.shape == xe.shape
        assert torch.equal(y.cpu(), ye)
        diff = (x.cpu().int() - xe.int()).abs().float()
        assert diff.mean() < 3.0, float(diff.mean())
    dd = stats.device_decode
    assert dd is not None and dd.gpu > 0 and dd.gpu + dd.cpu == 52


@RUNTIMES
def test_a_tar_member_the_bridge_cannot_decode_is_named(tmp_path: Path, loader_process: bool) -> None:
    """In a tar shard, a JPEG that only the bridge finds undecodable: the DecodeError names
    the shard and the member, in either runtime (the loader process's bridge judges it with a
    failure policy of its own, which must know the members too)."""
    rng = np.random.default_rng(3)
    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for k in range(12):
            data = encode(make_image(rng, 48, 36))
            if k == 5:
                data = data[:400] + b"\xff\xd9"  # passes the screening, decodes nowhere
            info = tarfile.TarInfo(f"s_{k:03d}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = FileDataset.from_tars([str(shard)], label=None)
    kw: dict[str, Any] = {
        "batch_size": 4,
        "num_workers": 1,
        "shuffle": False,
        "loader_process": loader_process,
    }
    with Loader(ds, decode=decoder("cpu"), **kw) as loader, pytest.raises(DecodeError) as caught:
        list(loader)
    assert caught.value.member == "s_005.jpg" and caught.value.path == str(shard)
    assert "member 's_005.jpg'" in str(caught.value)

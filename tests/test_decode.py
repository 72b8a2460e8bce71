"""aioloader.ImageDecoder called in-process, and through the worker's task function
(``aioloader.decode.worker.run_chunk``, without processes: ``_decode`` is monkeypatched, as
``worker_init`` would set SIGINT to ignored in the test process). The rest of the worker
protocol is in test_protocol.py.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import MARKER_IN_SCAN, overwrite_scan, scan_garbage, script_env
from PIL import Image, ImageFile, JpegImagePlugin, UnidentifiedImageError

from aioloader import ImageDecoder
from aioloader.decode import worker as _worker
from aioloader.decode.chunk import Chunk
from aioloader.memory.results import Pickled
from aioloader.synthetic import make_image


def encode(img: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def bands(width: int, height: int, *, vertical: bool = True) -> Image.Image:
    """Red | green | blue bands (quarter, half, quarter) across the width (or the height)."""
    arr = np.zeros((height, width, 3), dtype=np.uint8)
    n = width if vertical else height
    idx = np.arange(n)
    red, blue = idx < n // 4, idx >= n - n // 4
    green = ~(red | blue)
    for channel, mask in ((0, red), (1, green), (2, blue)):
        if vertical:
            arr[:, mask, channel] = 255
        else:
            arr[mask, :, channel] = 255
    return Image.fromarray(arr, "RGB")


def left_right(size: int) -> Image.Image:
    """A square image: red left half, blue right half."""
    arr = np.zeros((size, size, 3), dtype=np.uint8)
    arr[:, : size // 2, 0] = 255
    arr[:, size // 2 :, 2] = 255
    return Image.fromarray(arr, "RGB")


def rich_image(width: int = 160, height: int = 120, seed: int = 0) -> bytes:
    return encode(make_image(np.random.default_rng(seed), width, height), "PNG")


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    """A 2000x1500 JPEG, large enough that draft mode reduces it."""
    return encode(make_image(np.random.default_rng(1), 2000, 1500), "JPEG", quality=90)


@pytest.fixture
def draft_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Record every JpegImageFile.draft call: (size before, size after)."""
    calls: list[tuple[tuple[int, int], tuple[int, int]]] = []
    original = JpegImagePlugin.JpegImageFile.draft

    def recording(self: JpegImagePlugin.JpegImageFile, mode: str | None, size: Any) -> Any:
        before = self.size
        result = original(self, mode, size)
        calls.append((before, self.size))
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", recording)
    return calls


def run_one(data: bytes, seed: int = 0, epoch: int = 0, index: int = 0) -> Any:
    """One sample through the worker's task function, bytes in, no slab."""
    results = _worker.run_chunk(Chunk(None, None, [(0, index, data)], seed, epoch))
    assert len(results) == 1
    return results[0]


def in_worker(monkeypatch: pytest.MonkeyPatch, decode: Callable[[bytes], Any]) -> Callable[..., Any]:
    """Install ``decode`` as the worker's function; return a runner that unwraps success."""
    monkeypatch.setattr(_worker, "_decode", decode)

    def run(data: bytes, seed: int = 0, epoch: int = 0, index: int = 0) -> Any:
        result = run_one(data, seed, epoch, index)
        assert isinstance(result, Pickled), result
        return result.value

    return run


# -- output shape ----------------------------------------------------------------------------


def test_output_dtype_and_shape() -> None:
    data = rich_image()
    for size, shape in ((32, (3, 32, 32)), ((24, 40), (3, 24, 40)), ((40, 24), (3, 40, 24)), (1, (3, 1, 1))):
        dec = ImageDecoder(size)
        out = dec(data)
        assert isinstance(out, np.ndarray)
        assert out.dtype == np.uint8
        assert out.shape == shape == dec.output_shape, size
        assert out.flags["C_CONTIGUOUS"]


def test_defaults_and_repr() -> None:
    dec = ImageDecoder()
    assert dec.output_shape == (3, 224, 224)
    assert dec.crop == "center"
    assert dec.draft is True
    assert "(224, 224)" in repr(dec)


def test_channels_are_rgb_order() -> None:
    img = Image.new("RGB", (20, 20), (200, 30, 60))
    out = ImageDecoder(8)(encode(img, "PNG"))
    assert out[:, 4, 4].tolist() == [200, 30, 60]


# -- Pillow modes ----------------------------------------------------------------------------


def _palette(transparency: Any = None) -> bytes:
    img = Image.new("P", (16, 16), 1)
    img.putpalette([10, 20, 30, 200, 100, 50] + [0] * (256 * 3 - 6))
    if transparency is None:
        return encode(img, "PNG")
    return encode(img, "PNG", transparency=transparency)


MODE_CASES: dict[str, tuple[Callable[[], bytes], tuple[int, int, int], int]] = {
    # name: (make bytes, expected RGB everywhere, tolerance)
    "RGB-jpeg": (
        lambda: encode(Image.new("RGB", (32, 24), (200, 30, 60)), "JPEG", quality=95),
        (200, 30, 60),
        6,
    ),
    "RGB-png": (lambda: encode(Image.new("RGB", (32, 24), (200, 30, 60)), "PNG"), (200, 30, 60), 0),
    "L-jpeg": (lambda: encode(Image.new("L", (32, 24), 77), "JPEG", quality=95), (77, 77, 77), 2),
    "LA-png": (lambda: encode(Image.new("LA", (32, 24), (77, 10)), "PNG"), (77, 77, 77), 0),
    "P-png": (lambda: _palette(), (200, 100, 50), 0),
    "P-transparent-index-png": (lambda: _palette(transparency=1), (200, 100, 50), 0),
    "P-transparent-bytes-png": (lambda: _palette(transparency=bytes([255, 0])), (200, 100, 50), 0),
    "RGBA-png": (lambda: encode(Image.new("RGBA", (32, 24), (1, 2, 250, 0)), "PNG"), (1, 2, 250), 0),
    "CMYK-jpeg": (
        lambda: encode(Image.new("CMYK", (32, 24), (255, 0, 0, 0)), "JPEG", quality=95),
        (0, 255, 255),
        6,
    ),
    "P-gif": (lambda: encode(Image.new("RGB", (32, 24), (255, 0, 0)).convert("P"), "GIF"), (255, 0, 0), 0),
    "RGB-bmp": (lambda: encode(Image.new("RGB", (32, 24), (9, 8, 7)), "BMP"), (9, 8, 7), 0),
    "RGB-webp-lossless": (
        lambda: encode(Image.new("RGB", (32, 24), (9, 8, 7)), "WEBP", lossless=True),
        (9, 8, 7),
        0,
    ),
}


def test_every_mode_decodes_to_rgb() -> None:
    wrong = []
    for case, (make, expected, tol) in sorted(MODE_CASES.items()):
        data = make()
        for draft in (True, False):
            out = ImageDecoder(16, draft=draft)(data)
            assert out.dtype == np.uint8
            assert out.shape == (3, 16, 16)
            diff = np.abs(out.astype(int) - np.array(expected)[:, None, None])
            if diff.max() > tol:
                wrong.append(f"{case} draft={draft}: got {out[:, 8, 8].tolist()}, want {list(expected)}")
    assert not wrong, wrong


def test_mode_cases_really_have_those_modes() -> None:
    """Guard the table above: the files open in the modes the cases are named after."""
    expect = {"RGB-jpeg": "RGB", "L-jpeg": "L", "LA-png": "LA", "P-png": "P", "RGBA-png": "RGBA"}
    expect |= {"CMYK-jpeg": "CMYK", "P-transparent-index-png": "P", "P-transparent-bytes-png": "P"}
    for case, mode in expect.items():
        img = Image.open(io.BytesIO(MODE_CASES[case][0]()))
        assert img.mode == mode, case
    assert "transparency" in Image.open(io.BytesIO(_palette(transparency=1))).info


def _gray_row(values: list[int], dtype: Any) -> np.ndarray:
    return np.array([values] * 4, dtype=dtype)


def test_i16_png_is_scaled_to_8_bits() -> None:
    arr = _gray_row([0, 256 * 100, 32768, 65535], np.uint16)
    img = Image.fromarray(arr)
    data = encode(img, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    out = ImageDecoder((4, 4), resample="nearest")(data)
    assert np.array_equal(out[0], out[1]) and np.array_equal(out[1], out[2])
    row = out[0, 0].astype(int)
    assert row[0] == 0
    assert abs(row[1] - 100) <= 1
    assert abs(row[2] - 128) <= 1
    assert row[3] >= 254


def test_i_mode_tiff_is_scaled_to_8_bits() -> None:
    img = Image.fromarray(_gray_row([0, 256 * 100, 32768, 65535], np.int32))
    data = encode(img, "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    row = ImageDecoder((4, 4), resample="nearest")(data)[:, 0].astype(int)
    assert row[0].tolist() == row[1].tolist() == row[2].tolist()
    assert row[0, 0] == 0
    assert abs(row[0, 1] - 100) <= 1
    assert abs(row[0, 2] - 128) <= 1
    assert row[0, 3] >= 254


def test_f_mode_tiff() -> None:
    img = Image.fromarray(_gray_row([0.0, 100.2, 200.0, 250.0], np.float32))
    data = encode(img, "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "F"
    out = ImageDecoder((4, 4), resample="nearest")(data)
    assert out[:, 0].tolist() == [[0, 100, 200, 250]] * 3


def test_1_bit_mode() -> None:
    arr = np.zeros((16, 16), dtype=bool)
    arr[:, 8:] = True
    img = Image.fromarray(arr)
    assert img.mode == "1"
    data = encode(img, "PNG")
    assert Image.open(io.BytesIO(data)).mode == "1"
    out = ImageDecoder(16, resample="nearest")(data)
    assert np.all(out[:, :, :8] == 0)
    assert np.all(out[:, :, 8:] == 255)


# -- geometry --------------------------------------------------------------------------------


def test_small_image_is_upscaled() -> None:
    arr = np.zeros((2, 2, 3), dtype=np.uint8)
    arr[0, 0] = (255, 0, 0)
    arr[0, 1] = (0, 255, 0)
    arr[1, 0] = (0, 0, 255)
    arr[1, 1] = (255, 255, 255)
    out = ImageDecoder(32, resample="nearest")(encode(Image.fromarray(arr), "PNG"))
    assert out.shape == (3, 32, 32)
    assert out[:, :16, :16].reshape(3, -1).T.tolist() == [[255, 0, 0]] * 256
    assert out[:, :16, 16:].reshape(3, -1).T.tolist() == [[0, 255, 0]] * 256
    assert out[:, 16:, :16].reshape(3, -1).T.tolist() == [[0, 0, 255]] * 256
    assert out[:, 16:, 16:].reshape(3, -1).T.tolist() == [[255, 255, 255]] * 256


def test_uniform_small_image_upscaled_with_every_resample() -> None:
    data = encode(Image.new("RGB", (5, 3), (12, 34, 56)), "PNG")
    for resample in ("nearest", "bilinear", "bicubic", "lanczos"):
        out = ImageDecoder(40, resample=resample)(data).astype(int)
        assert np.abs(out - np.array([12, 34, 56])[:, None, None]).max() <= 1, resample


def test_center_crop_of_wide_image_keeps_the_middle() -> None:
    for fmt, kwargs in (("PNG", {}), ("JPEG", {"quality": 95})):
        data = encode(bands(400, 100), fmt, **kwargs)
        for draft in (True, False):
            out = ImageDecoder(50, draft=draft)(data).astype(int)
            # Only the green middle half survives; no red (left) or blue (right).
            assert np.abs(out - np.array([0, 255, 0])[:, None, None]).max() <= 12, (fmt, draft)


def test_center_crop_of_tall_image_keeps_the_middle() -> None:
    data = encode(bands(100, 400, vertical=False), "PNG")
    out = ImageDecoder(50)(data)
    assert np.all(out[0] == 0) and np.all(out[1] == 255) and np.all(out[2] == 0)


def test_center_crop_wide_output_from_square_image() -> None:
    # Output aspect 2: the centred box is rows 32..95. Red above row 16, blue from row 112,
    # so the filter's support at the box edges stays inside green.
    arr = np.zeros((128, 128, 3), dtype=np.uint8)
    arr[:16, :, 0] = 255
    arr[16:112, :, 1] = 255
    arr[112:, :, 2] = 255
    data = encode(Image.fromarray(arr), "PNG")
    out = ImageDecoder((32, 64))(data)
    assert out.shape == (3, 32, 64)
    assert np.all(out[0] == 0) and np.all(out[1] == 255) and np.all(out[2] == 0)


def test_center_crop_exact_columns() -> None:
    arr = np.zeros((50, 200, 3), dtype=np.uint8)
    arr[:, :, 0] = np.arange(200, dtype=np.uint8)[None, :]
    arr[:, :, 1] = np.arange(50, dtype=np.uint8)[:, None]
    out = ImageDecoder(50, resample="nearest")(encode(Image.fromarray(arr), "PNG"))
    # The centred 50x50 box of a 200x50 image spans columns 75..124 and every row.
    assert out[0, 0].tolist() == list(range(75, 125))
    assert out[1, :, 0].tolist() == list(range(50))


# -- draft -----------------------------------------------------------------------------------


def test_draft_gives_similar_pixels(big_jpeg: bytes, draft_calls: list[Any]) -> None:
    fast = ImageDecoder(224, draft=True)(big_jpeg).astype(int)
    assert len(draft_calls) == 1
    before, after = draft_calls[0]
    assert before == (2000, 1500)
    # Really reduced (DCT scaling by 1/2, 1/4 or 1/8), yet still >= the 224 output over the crop.
    assert after[0] <= 1000 and after[1] <= 750
    assert after[1] >= 224
    slow = ImageDecoder(224, draft=False)(big_jpeg).astype(int)
    assert len(draft_calls) == 1  # draft=False never asks for a reduced decode
    assert np.abs(fast - slow).mean() < 10


def test_draft_not_used_when_no_reduction_fits(big_jpeg: bytes, draft_calls: list[Any]) -> None:
    # The centre box is 1500x1500; an output of 1500 needs every pixel.
    ImageDecoder(1500, draft=True)(big_jpeg)
    assert all(after == before for before, after in draft_calls)


def test_draft_not_used_for_png(draft_calls: list[Any]) -> None:
    ImageDecoder(16, draft=True)(encode(make_image(np.random.default_rng(0), 400, 300), "PNG"))
    assert draft_calls == []


def test_draft_with_wide_output_and_other_jpeg_modes(big_jpeg: bytes, draft_calls: list[Any]) -> None:
    size = (60, 200)
    fast = ImageDecoder(size, draft=True)(big_jpeg).astype(int)
    slow = ImageDecoder(size, draft=False)(big_jpeg).astype(int)
    assert np.abs(fast - slow).mean() < 10
    src = make_image(np.random.default_rng(2), 1200, 900)
    for mode in ("L", "CMYK"):
        data = encode(src.convert(mode), "JPEG", quality=90)
        fast = ImageDecoder(64, draft=True)(data).astype(int)
        slow = ImageDecoder(64, draft=False)(data).astype(int)
        assert fast.shape == (3, 64, 64)
        assert np.abs(fast - slow).mean() < 10, mode
        if mode == "L":
            assert np.array_equal(fast[0], fast[1]) and np.array_equal(fast[1], fast[2])
    assert len(draft_calls) >= 3
    assert all(after[0] < before[0] for before, after in draft_calls)


def test_random_crop_with_draft_matches_without(
    monkeypatch: pytest.MonkeyPatch, big_jpeg: bytes, draft_calls: list[Any]
) -> None:
    # Same (seed, epoch, index) -> same box; draft must map the box into the reduced image.
    fast = ImageDecoder(64, crop="random", scale=(0.2, 0.6), draft=True)
    slow = ImageDecoder(64, crop="random", scale=(0.2, 0.6), draft=False)
    for index in range(4):
        a = in_worker(monkeypatch, fast)(big_jpeg, 0, 0, index).astype(int)
        b = in_worker(monkeypatch, slow)(big_jpeg, 0, 0, index).astype(int)
        assert np.abs(a - b).mean() < 10, index
    assert draft_calls, "a 64-pixel crop of a 2000x1500 JPEG should use draft"


# -- random crop ------------------------------------------------------------------------------


def test_random_crop_is_a_function_of_seed_epoch_index(monkeypatch: pytest.MonkeyPatch) -> None:
    data = rich_image(200, 150)
    run = in_worker(monkeypatch, ImageDecoder(48, crop="random", hflip=True))
    base = run(data, 3, 1, 5)
    assert base.shape == (3, 48, 48)
    assert np.array_equal(run(data, 3, 1, 5), base)
    assert np.array_equal(run(data, 3, 1, 5), base)
    assert not np.array_equal(run(data, 3, 1, 6), base)
    assert not np.array_equal(run(data, 3, 2, 5), base)
    assert not np.array_equal(run(data, 4, 1, 5), base)
    outs = {run(data, 3, 1, i).tobytes() for i in range(10)}
    assert len(outs) == 10


def test_random_crop_full_scale_square_equals_center_crop(monkeypatch: pytest.MonkeyPatch) -> None:
    data = rich_image(96, 96)
    run = in_worker(monkeypatch, ImageDecoder(32, crop="random", scale=(1.0, 1.0), ratio=(1.0, 1.0)))
    center = ImageDecoder(32)(data)
    for index in range(3):
        assert np.array_equal(run(data, 0, 0, index), center)


def test_hflip_flips_about_half_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(left_right(64), "PNG")
    dec = ImageDecoder(16, crop="random", scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=True)
    run = in_worker(monkeypatch, dec)
    plain = ImageDecoder(16)(data)
    flipped = plain[:, :, ::-1]
    kinds = []
    for index in range(40):
        out = run(data, 0, 0, index)
        if np.array_equal(out, plain):
            kinds.append("plain")
        elif np.array_equal(out, flipped):
            kinds.append("flipped")
        else:
            pytest.fail(f"sample {index} is neither the image nor its mirror")
    assert 5 <= kinds.count("flipped") <= 35


def test_no_hflip_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(left_right(64), "PNG")
    run = in_worker(monkeypatch, ImageDecoder(16, crop="random", scale=(1.0, 1.0), ratio=(1.0, 1.0)))
    plain = ImageDecoder(16)(data)
    for index in range(10):
        assert np.array_equal(run(data, 0, 0, index), plain)


def test_random_crop_outside_a_worker_is_unseeded() -> None:
    data = rich_image(200, 150)
    dec = ImageDecoder(32, crop="random")
    outs = {dec(data).tobytes() for _ in range(4)}
    assert len(outs) > 1


# -- arguments, pickling, errors -----------------------------------------------------------------


BAD_ARGS: list[tuple[dict[str, Any], str]] = [
    ({"size": 0}, "size=0"),
    ({"size": -3}, "size=-3"),
    ({"size": (0, 10)}, "size=(0, 10)"),
    ({"size": (10, -1)}, "size=(10, -1)"),
    ({"size": True}, "size=True"),
    ({"size": (1.5, 2)}, "size=(1.5, 2)"),
    ({"crop": "x"}, "crop='x'"),
    ({"crop": None}, "crop=None"),
    ({"scale": (0.0, 1.0)}, "scale=(0.0, 1.0)"),
    ({"scale": (0.6, 0.5)}, "scale=(0.6, 0.5)"),
    ({"scale": (0.5, 1.5)}, "scale=(0.5, 1.5)"),
    ({"ratio": (0.0, 1.0)}, "ratio=(0.0, 1.0)"),
    ({"ratio": (2.0, 1.0)}, "ratio=(2.0, 1.0)"),
    ({"ratio": (-1.0, 1.0)}, "ratio=(-1.0, 1.0)"),
    ({"resample": "cubic"}, "resample='cubic'"),
]


def test_invalid_arguments_raise_showing_the_value() -> None:
    for kwargs, shown in BAD_ARGS:
        with pytest.raises(ValueError) as info:
            ImageDecoder(**kwargs)
        assert shown in str(info.value), (kwargs, str(info.value))


def test_bool_width_rejected() -> None:
    with pytest.raises(ValueError, match=r"size=\(8, True\)"):
        ImageDecoder((8, True))  # type: ignore[arg-type]


def test_non_int_size_error_shows_the_value() -> None:
    for size, shown in ((2.5, "size=2.5"), ("224", "size='224'"), ((1, 2, 3), "size=(1, 2, 3)")):
        with pytest.raises((ValueError, TypeError)) as info:
            ImageDecoder(size)  # type: ignore[arg-type]
        assert shown in str(info.value), str(info.value)


def test_valid_edge_arguments_accepted() -> None:
    ImageDecoder(1, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    ImageDecoder((1, 1000), crop="random", scale=(0.01, 0.01), ratio=(0.1, 10.0))


def test_pickle_round_trip() -> None:
    dec = ImageDecoder(
        (20, 30), crop="random", scale=(0.5, 0.9), ratio=(0.5, 2.0), hflip=True, resample="bicubic"
    )
    copy = pickle.loads(pickle.dumps(dec))
    assert type(copy) is ImageDecoder
    assert vars(copy) == vars(dec)
    center = ImageDecoder(24, draft=False)
    data = rich_image()
    assert np.array_equal(pickle.loads(pickle.dumps(center))(data), center(data))


def test_corrupt_bytes_raise() -> None:
    for data in (
        b"",
        b"not an image at all",
        b"\xff\xd8\xff" + b"\x00" * 64,
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 8,
    ):
        with pytest.raises((UnidentifiedImageError, OSError, SyntaxError, ValueError)):
            ImageDecoder(16)(data)


def test_a_file_that_is_no_image_is_named_so_without_an_object_repr() -> None:
    """Pillow names what it could not identify by its repr (``<..._Source object at 0x...>``):
    the message says what the bytes were instead."""
    with pytest.raises(UnidentifiedImageError) as info:
        ImageDecoder(16)(b"version https://git-lfs.github.com/spec/v1")
    message = str(info.value)
    assert message == "cannot identify image file (42 bytes, starting b'version https://')", message
    assert info.value.__suppress_context__ and isinstance(info.value, OSError)
    with pytest.raises(UnidentifiedImageError, match=r"^cannot identify image file \(0 bytes\)$"):
        ImageDecoder(16).decode_window(b"", (0.0, 0.0, 1.0, 1.0), False)


# -- damaged files, whatever Pillow's LOAD_TRUNCATED_IMAGES says -----------------------------
# A training script may set PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True; hot start decodes on
# a thread of that very process, and workers forked after it was set inherit it. These cases
# run in this process with the global set either way; test_faults.py sets it in a script.

SETTINGS = pytest.mark.parametrize("load_truncated", [False, True], ids=["pillow-default", "load-truncated"])
TRUNCATABLE = {"JPEG": {"quality": 90}, "PNG": {}, "BMP": {}, "GIF": {}, "TIFF": {}}


@pytest.fixture
def no_assignment_to_image_file(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every attribute assigned on PIL.ImageFile from now on (the flag included): ImageDecoder
    must only read the global, since other threads of the process may use Pillow meanwhile."""
    assigned: list[str] = []

    class Recording(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            assigned.append(name)
            super().__setattr__(name, value)

    monkeypatch.setattr(ImageFile, "__class__", Recording)
    return assigned


@SETTINGS
def test_truncated_file_raises_never_a_partial_image(
    monkeypatch: pytest.MonkeyPatch, load_truncated: bool
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)
    src = make_image(np.random.default_rng(0), 400, 300)
    for fmt, kwargs in TRUNCATABLE.items():
        data = encode(src, fmt, **kwargs)
        assert ImageDecoder(64)(data).shape == (3, 64, 64)  # the whole file is fine
        for share in (0.5, 0.99):
            cut = data[: int(len(data) * share)]
            if load_truncated:  # the premise: Pillow itself now makes a partial image of it
                assert Image.open(io.BytesIO(cut)).convert("RGB").size == src.size
            for draft in (True, False):
                with pytest.raises(OSError, match="truncated"):
                    ImageDecoder(64, draft=draft)(cut)


def test_the_global_is_read_never_changed(
    monkeypatch: pytest.MonkeyPatch, no_assignment_to_image_file: list[str]
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    no_assignment_to_image_file.clear()  # the line above was the test's own
    data = encode(make_image(np.random.default_rng(0), 400, 300), "JPEG", quality=90)
    with pytest.raises(OSError, match="truncated"):
        ImageDecoder(64)(data[: len(data) // 2])
    assert ImageDecoder(64)(data).shape == (3, 64, 64)
    assert no_assignment_to_image_file == [] and ImageFile.LOAD_TRUNCATED_IMAGES is True


@SETTINGS
def test_a_marker_inside_the_scan_stops_the_decoder_an_error_never_a_partial_image(
    monkeypatch: pytest.MonkeyPatch, load_truncated: bool
) -> None:
    """A start-of-frame marker where compressed data belongs: libjpeg stops with an error,
    which Pillow ignores when the global is set (leaving the rest grey)."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)
    broken = overwrite_scan(
        encode(make_image(np.random.default_rng(0), 400, 300), "JPEG", quality=90), 0.5, MARKER_IN_SCAN
    )
    if load_truncated:  # the premise: Pillow itself now makes a partial image of it
        assert Image.open(io.BytesIO(broken)).convert("RGB").size == (400, 300)
    for draft in (True, False):
        with pytest.raises(OSError, match="broken data stream"):
            ImageDecoder(64, draft=draft)(broken)


@SETTINGS
def test_garbage_inside_the_scan_decodes_without_an_error_wrong_from_there_on(
    monkeypatch: pytest.MonkeyPatch, load_truncated: bool
) -> None:
    """What really happens to garbage in a JPEG's entropy-coded data (the headers intact, no
    0xFF among it): libjpeg only warns about corrupt data, Pillow does not report warnings,
    so nothing can tell: the image comes back, bit for bit the intact file's above the block
    row the garbage hit (less one row: chroma upsampling reads the row below) and wrong in
    every row from there to the bottom. Documented in ImageDecoder's docstring."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)
    data = encode(make_image(np.random.default_rng(0), 256, 192), "JPEG", quality=90)
    decode = ImageDecoder((192, 256))  # the whole image, no resampling: pixels as decoded
    intact = decode(data)
    for at, seed in ((0.3, 1), (0.5, 2), (0.7, 3)):
        damaged = decode(overwrite_scan(data, at, scan_garbage(64, seed)))
        wrong = np.flatnonzero((damaged != intact).any(axis=(0, 2)))
        assert wrong.size, at
        first = int(wrong[0])
        assert first >= 15 and (first + 1) % 16 == 0, (at, first)  # a 16-row block row, less one
        assert wrong.tolist() == list(range(first, 192)), at


PLUGINS_SCRIPT = """
from PIL import Image  # imported, no image opened yet: Pillow's formats not registered
import numpy as np
from aioloader import Loader


def formats_known(data):
    return np.array([Image._initialized], dtype=np.int64)


if __name__ == "__main__":
    assert Image._initialized == 0
    with Loader({paths!r}, batch_size=4, decode=formats_known, num_workers=2, shuffle=False) as loader:
        print(sorted({{int(v) for b in loader for v in b.flatten()}}))
"""


def test_workers_register_pillows_formats_before_their_first_sample(
    tmp_path: Any, numbered: list[str]
) -> None:
    """Pillow registers JPEG, PNG, BMP and GIF on the first ``Image.open`` (10-12 ms of
    imports): a worker does that as it starts, before its first sample, so the first batch
    does not wait for it."""

    script = tmp_path / "plugins.py"
    script.write_text(PLUGINS_SCRIPT.format(paths=numbered[:8]))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=script_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] in ("[1]", "[2]"), out.stdout  # 1: preinit, 2: init

"""The CUDA batch decoder (aioloader/decode/nvimgcodec.py).

On the CPU: its pure helpers (the decode window, the box inside it, Pillow's resize
reproduced in torch), the missing-library error, and its whole ``decode`` driven through a
stand-in for nvImageCodec that decodes the asked region with Pillow (``FakeCodec``): windows,
taps, grey images, flips and failures, checked against the CPU path's pixels. With a CUDA GPU
(``@pytest.mark.cuda``): the same batch through the real nvImageCodec.
"""

from __future__ import annotations

import io
import math
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from aioloader import ImageDecoder
from aioloader.decode.nvimgcodec import NvImageCodecDecoder, inner_box, resize_box, roi_window
from aioloader.synthetic import make_image

RESAMPLES = ["nearest", "bilinear", "bicubic", "lanczos"]
SUPPORT = {"nearest": 0.0, "bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
H, W = 40, 56


def encode(img: Image.Image, fmt: str = "JPEG", **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def reference(resample: str, data: bytes, box: tuple[float, float, float, float], flip: bool) -> np.ndarray:
    """What the CPU path makes of ``box`` of ``data`` (draft off: the whole image decoded)."""
    dec = ImageDecoder((H, W), draft=False, resample=resample)  # type: ignore[arg-type]
    if hasattr(dec, "decode_window"):
        return np.asarray(dec.decode_window(data, box, flip))
    # The same steps where ImageDecoder has no decode_window yet (it comes with the device decode).
    filters = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR}
    filters |= {"bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS}
    out = Image.open(io.BytesIO(data)).convert("RGB").resize((W, H), filters[resample], box=box)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1)


def batch(seed: int = 0) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """JPEGs (RGB, grey, progressive, one cut in half), a PNG and garbage; random crop boxes,
    one small box blown up, one the whole image; random flips."""
    rng = np.random.default_rng(seed)
    rgb = make_image(rng, 160, 120)
    datas = [
        encode(rgb, quality=92),
        encode(make_image(rng, 97, 131).convert("L"), quality=92),
        encode(make_image(rng, 150, 100), quality=92, progressive=True),
    ]
    cut = encode(make_image(rng, 160, 120), quality=92)
    datas += [
        cut[: len(cut) // 2],
        encode(rgb, "PNG"),
        b"not an image",
        encode(make_image(rng, 73, 61), quality=92),
    ]
    boxes, flips = [], []
    for data in datas:
        try:
            w, h = Image.open(io.BytesIO(data)).size
        except Exception:  # noqa: BLE001 - garbage: any box
            w, h = 50, 50
        # a random-resized-crop box: 8% to all of the area, aspect 3/4 to 4/3, fractional
        side = math.sqrt(rng.uniform(0.08, 1.0) * w * h)
        bw, bh = side * math.sqrt(aspect := rng.uniform(3 / 4, 4 / 3)), side / math.sqrt(aspect)
        bw, bh = min(bw, w), min(bh, h)
        x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        boxes.append((x0, y0, x0 + bw, y0 + bh))
        flips.append(bool(rng.random() < 0.5))
    boxes[0] = (10.25, 20.5, 31.75, 35.0)  # upscaled about 2.6 times
    boxes[6] = (0.0, 0.0, 73.0, 61.0)  # the whole image
    return datas, np.array(boxes), np.array(flips)


OK = [0, 1, 2, 6]  # the positions of batch() that decode
BAD = [3, 4, 5]


# -- pure helpers ----------------------------------------------------------------------------


def test_roi_window_is_the_integer_window_holding_the_box() -> None:
    assert roi_window((10.3, 5.7, 50.2, 40.0), 100, 80) == (10, 5, 51, 40)
    assert roi_window((10.3, 5.7, 50.2, 40.0), 100, 80, (2.5, 3.0)) == (7, 2, 53, 43)
    assert roi_window((-0.5, -2.0, 100.4, 80.0), 100, 80) == (0, 0, 100, 80)
    assert roi_window((1.0, 1.0, 99.0, 79.0), 100, 80, (5.0, 5.0)) == (0, 0, 100, 80)
    # never empty, never outside the image
    assert roi_window((100.0, 80.0, 100.0, 80.0), 100, 80) == (99, 79, 100, 80)
    assert roi_window((3.2, 4.0, 3.2, 4.0), 100, 80) == (3, 4, 4, 5)


def test_inner_box_is_the_box_in_the_windows_pixels() -> None:
    box = (10.3, 5.7, 50.2, 40.0)
    assert inner_box(box, roi_window(box, 100, 80)) == pytest.approx((0.3, 0.7, 40.2, 35.0))
    assert inner_box(box, (0, 0, 100, 80)) == box


@pytest.mark.parametrize("resample", RESAMPLES)
def test_resize_box_is_pillows_resize_with_box(resample: str) -> None:
    """Within a level of Pillow (its fixed-point coefficients), nearest exactly; on the whole
    image and on a window holding the box and the filter's reach, as the decoder crops."""
    rng = np.random.default_rng(1)
    for mode in ("RGB", "L"):
        img = make_image(rng, 300, 200).convert(mode)
        pixels = torch.from_numpy(np.array(img)).reshape(200, 300, -1)
        for trial in range(25):
            x0, y0 = rng.uniform(0, 250), rng.uniform(0, 150)
            box = (x0, y0, rng.uniform(x0 + 0.5, 300), rng.uniform(y0 + 0.5, 200))
            h, w = int(rng.integers(3, 150)), int(rng.integers(3, 150))
            want = np.asarray(
                img.convert("RGB").resize((w, h), getattr(Image.Resampling, resample.upper()), box=box)
            )
            if trial % 2:
                reach = (box[2] - box[0]) / w, (box[3] - box[1]) / h
                margin = (SUPPORT[resample] * max(reach[0], 1) + 1, SUPPORT[resample] * max(reach[1], 1) + 1)
                win = roi_window(box, 300, 200, margin)
                got = resize_box(
                    pixels[win[1] : win[3], win[0] : win[2]], inner_box(box, win), h, w, resample
                )
            else:
                got = resize_box(pixels, box, h, w, resample)
            diff = np.abs(got.numpy().transpose(1, 2, 0).astype(int) - want.astype(int))
            assert diff.max() <= (0 if resample == "nearest" else 1), (mode, box, h, w)


def test_without_nvimgcodec_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(ImportError, match=r"aioloader\[gpu\]") as info:
        NvImageCodecDecoder(torch.device("cuda"), H, W, "bilinear")
    assert isinstance(info.value.__cause__, ImportError)


# -- decode() through a stand-in for nvImageCodec ---------------------------------------------


class FakeCodec(types.ModuleType):
    """nvImageCodec's Python API as the decoder uses it, decoding with Pillow: ``CodeStream``
    parses (raises where Pillow can't open it), ``get_sub_code_stream(region=)`` keeps the
    region, ``Decoder.decode`` gives an HWC array of the region (grey: one channel) or None
    per image; ``batch_error`` makes a batched call raise, ``batch_none`` gives all None;
    ``lenient`` decodes a JPEG cut short without an error, as nvJPEG does (the rows missing
    grey)."""

    class ColorSpec:
        SRGB = "srgb"

    def __init__(self) -> None:
        super().__init__("nvidia.nvimgcodec")
        self.calls: list[dict[str, Any]] = []
        self.batch_error = self.batch_none = False
        self.shrink = False  # decode one row short of the region asked for
        self.lenient = False
        self.windows: list[tuple[int, int, int, int] | None] = []  # decoded, None: the whole image
        fake = self

        class DecodeParams:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs = kwargs

        class Region:
            def __init__(self, start_y: int, start_x: int, end_y: int, end_x: int) -> None:
                self.window = (start_x, start_y, end_x, end_y)

        class CodeStream:
            def __init__(self, array: np.ndarray) -> None:
                self.data, self.window = array.tobytes(), None
                try:
                    img = Image.open(io.BytesIO(self.data))
                except Exception as e:  # as nvImageCodec: a RuntimeError
                    raise RuntimeError("Failed to get image info") from e
                self.codec_name = {"JPEG": "jpeg", "PNG": "png"}.get(str(img.format), "unknown")
                self.width, self.height = img.size

            def get_sub_code_stream(self, region: Region) -> CodeStream:
                sub = CodeStream(np.frombuffer(self.data, np.uint8))
                sub.window = region.window
                return sub

        class Decoder:
            def __init__(self, device_id: int, max_num_cpu_threads: int, options: str) -> None:
                fake.calls.append(
                    {"device_id": device_id, "threads": max_num_cpu_threads, "options": options}
                )

            def decode(self, src: Any, *, params: DecodeParams, cuda_stream: int) -> Any:
                fake.calls.append(
                    {"n": len(src) if isinstance(src, list) else None, "stream": cuda_stream, **params.kwargs}
                )
                if not isinstance(src, list):
                    return self.one(src)
                if fake.batch_error:
                    raise RuntimeError("the whole batch failed")
                return [None] * len(src) if fake.batch_none else [self.one(s) for s in src]

            def one(self, code: CodeStream) -> np.ndarray | None:
                try:
                    img = Image.open(io.BytesIO(code.data))
                    ImageFile.LOAD_TRUNCATED_IMAGES = fake.lenient
                    img.load()
                except OSError:
                    return None
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = False
                arr = np.array(img if img.mode == "L" else img.convert("RGB")).reshape(
                    img.size[1], img.size[0], -1
                )
                fake.windows.append(code.window)
                x0, y0, x1, y1 = code.window or (0, 0, img.size[0], img.size[1])
                return arr[y0 : y1 - fake.shrink, x0:x1]

        self.DecodeParams, self.Region, self.CodeStream, self.Decoder = (
            DecodeParams,
            Region,
            CodeStream,
            Decoder,
        )


class FakeStream:
    cuda_stream = 12345


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCodec:
    codec = FakeCodec()
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", codec)
    return codec


def run(
    device: torch.device, resample: str, stream: Any, roi: bool = False
) -> tuple[list[int], torch.Tensor]:
    datas, boxes, flips = batch()
    dec = NvImageCodecDecoder(device, H, W, resample, roi=roi)
    dec.start()
    out = torch.full((len(datas), 3, H, W), 7, dtype=torch.uint8, device=device)
    try:
        failed = dec.decode([memoryview(d) for d in datas], boxes, flips, list(out), stream)
    finally:
        dec.close()
    return failed, out


def check(out: torch.Tensor, resample: str, mean: float, most: int) -> None:
    datas, boxes, flips = batch()
    for i in OK:
        want = reference(resample, datas[i], tuple(boxes[i]), bool(flips[i])).astype(int)
        diff = np.abs(out[i].cpu().numpy().astype(int) - want)
        assert diff.mean() < mean and diff.max() <= most, (i, diff.mean(), diff.max())
    assert (out[BAD] == 7).all()  # failed positions left untouched


@pytest.mark.parametrize("roi", [False, True], ids=["whole", "roi"])
@pytest.mark.parametrize("resample", RESAMPLES)
def test_decode_gives_the_cpu_paths_pixels_and_the_failed_positions(
    fake: FakeCodec, resample: str, roi: bool
) -> None:
    """Whole images (the default: nvJPEG < 13.2's GPU decoders refuse a region of a 4:2:0
    JPEG) or the crop window and the filter's reach alone: the CPU path's pixels."""
    failed, out = run(torch.device("cpu", 0), resample, FakeStream(), roi=roi)
    assert failed == BAD
    check(out, resample, mean=0.5, most=0 if resample == "nearest" else 1)
    datas, _, _ = batch()
    if roi:
        sizes = [Image.open(io.BytesIO(datas[i])).size for i in OK]
        assert all(w is not None for w in fake.windows)
        assert any(w != (0, 0, *size) for w, size in zip(fake.windows, sizes, strict=True))
    else:
        assert fake.windows == [None] * len(OK)
    start, call = fake.calls
    assert start == {"device_id": 0, "threads": 1, "options": ":fancy_upsampling=1"}
    # one batched call of the parsed JPEGs, on the caller's stream, EXIF orientation ignored
    assert call == {
        "n": 4,  # the JPEG cut short is not sent: it does not end with EOI
        "stream": 12345,
        "apply_exif_orientation": False,
        "color_spec": "srgb",
        "allow_any_depth": False,
    }


@pytest.mark.parametrize("how", ["batch_error", "batch_none"])
def test_a_failed_batch_is_decoded_image_by_image(fake: FakeCodec, how: str) -> None:
    setattr(fake, how, True)
    failed, out = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == BAD
    check(out, "bilinear", mean=0.5, most=1)
    assert [c["n"] for c in fake.calls[1:]] == [4, None, None, None, None]


def test_a_jpeg_cut_short_is_a_failed_position_though_the_codec_would_decode_it(fake: FakeCodec) -> None:
    """nvJPEG decodes a JPEG cut in half without an error; Pillow, on the CPU path, refuses
    it: the decoder does not send it (it does not end with EOI), so that it fails here too
    and the bridge's Pillow reports it."""
    fake.lenient = True
    datas, _, _ = batch()
    assert Image.open(io.BytesIO(datas[3])).size == (160, 120)  # its header is whole
    failed, out = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == BAD
    check(out, "bilinear", mean=0.5, most=1)
    assert fake.calls[1]["n"] == 4


def test_a_decoded_image_of_another_size_is_a_failed_position(fake: FakeCodec) -> None:
    fake.shrink = True
    failed, out = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == sorted(OK + BAD)
    assert (out == 7).all()


# -- the real nvImageCodec on a CUDA GPU -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("roi", [False, True], ids=["whole", "roi"])
@pytest.mark.parametrize("resample", RESAMPLES)
def test_cuda_decode_matches_the_cpu_path(resample: str, roi: bool) -> None:
    """Whole images and crop windows (with nvJPEG < 13.2, nvImageCodec decodes a window of
    a 4:2:0 JPEG on its CPU decoder: the same pixels, slower); the JPEG cut in half, the PNG
    and the garbage are failed positions, as on the CPU path."""
    pytest.importorskip("nvidia.nvimgcodec")
    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.Stream(device)  # a side stream: the work must be ordered on it
    failed, out = run(device, resample, stream, roi=roi)
    stream.synchronize()
    assert failed == BAD
    # nvJPEG's IDCT is not libjpeg-turbo's: a few levels here and there
    check(out, resample, mean=3.0, most=39)
    assert math.isclose(float((out[1, 0] == out[1, 1]).float().mean()), 1.0)  # grey: 3 equal channels
    assert torch.equal(out[1, 1], out[1, 2])

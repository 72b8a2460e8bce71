"""The CUDA batch decoder (aioloader/decode/nvimgcodec.py).

On the CPU: the missing-library error, and its whole ``decode`` driven through a stand-in for
nvImageCodec (``FakeCodec``) that decodes with Pillow and writes the pixels into the buffers
it is given (``as_image`` + ``decode(..., images=)``), or into its own where ``images=`` is
refused (an older nvImageCodec: one copy per image); then the batch's resize
(aioloader/decode/resize.py), so that the result is checked against the CPU path's pixels:
grey images, flips, failures. With a CUDA GPU (``@pytest.mark.cuda``): the same batch
through the real nvImageCodec, and a decode on a GPU whose memory PyTorch's cache holds.
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
from aioloader.decode.nvimgcodec import NvImageCodecDecoder
from aioloader.decode.resize import resize_batch
from aioloader.decode.taps import plan_batch
from aioloader.synthetic import make_image

RESAMPLES = ["nearest", "bilinear", "bicubic", "lanczos"]
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


def test_without_nvimgcodec_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(ImportError, match=r"aioloader\[gpu\]") as info:
        NvImageCodecDecoder(torch.device("cuda"))
    assert isinstance(info.value.__cause__, ImportError)


# -- decode() through a stand-in for nvImageCodec ---------------------------------------------


class FakeCodec(types.ModuleType):
    """nvImageCodec's Python API as the decoder uses it, decoding with Pillow: ``CodeStream``
    parses (raises where Pillow can't open it); ``as_image`` wraps a tensor (zero copy);
    ``Decoder.decode`` writes each image into the ``images=`` given, at the buffer's own pitch
    (the top-left corner), and gives them back, or makes arrays of its own without
    ``images=``; None per image it cannot decode. ``no_images`` makes ``images=`` a
    TypeError (nvImageCodec < 0.7); ``batch_error`` makes a batched call raise,
    ``batch_none`` gives all None; ``lenient`` decodes a JPEG cut short without an error, as
    nvJPEG does; ``shrink`` decodes one row short."""

    class ColorSpec:
        SRGB = "srgb"

    def __init__(self) -> None:
        super().__init__("nvidia.nvimgcodec")
        self.calls: list[dict[str, Any]] = []
        self.batch_error = self.batch_none = self.no_images = False
        self.shrink = False
        self.lenient = False
        self.wrapped: list[int] = []  # data_ptr of each tensor as_image wrapped
        fake = self

        class DecodeParams:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs = kwargs

        class CodeStream:
            def __init__(self, array: np.ndarray) -> None:
                self.data = array.tobytes()
                try:
                    img = Image.open(io.BytesIO(self.data))
                except Exception as e:  # as nvImageCodec: a RuntimeError
                    raise RuntimeError("Failed to get image info") from e
                self.codec_name = {"JPEG": "jpeg", "PNG": "png"}.get(str(img.format), "unknown")
                self.width, self.height = img.size

        class Wrapped:
            """An external buffer; after a decode, the image's view of it."""

            def __init__(self, tensor: torch.Tensor, stream: int) -> None:
                self.tensor, self.stream = tensor, stream
                self.shape: tuple[int, ...] = tuple(tensor.shape)

        def as_image(tensor: torch.Tensor, cuda_stream: int = 0) -> Wrapped:
            fake.wrapped.append(tensor.data_ptr())
            return Wrapped(tensor, cuda_stream)

        class Own:
            """An image in nvImageCodec's own buffer."""

            def __init__(self, arr: np.ndarray) -> None:
                self.arr, self.shape = arr, arr.shape

            def __dlpack__(self, stream: Any = None) -> Any:
                return torch.from_numpy(self.arr).__dlpack__()

            def __dlpack_device__(self) -> Any:
                return torch.from_numpy(self.arr).__dlpack_device__()

        class Decoder:
            def __init__(self, device_id: int, max_num_cpu_threads: int, options: str) -> None:
                fake.calls.append(
                    {"device_id": device_id, "threads": max_num_cpu_threads, "options": options}
                )

            def decode(
                self, src: list[Any], *, images: list[Any] | None = None, params: Any, cuda_stream: int
            ) -> list[Any]:
                if images is not None and fake.no_images:
                    raise TypeError("decode(): incompatible function arguments")
                fake.calls.append(
                    {"n": len(src), "external": images is not None, "stream": cuda_stream, **params.kwargs}
                )
                if images is not None:
                    assert len(images) == len(src) and all(im.stream == cuda_stream for im in images)
                if len(src) > 1 and fake.batch_error:
                    raise RuntimeError("the whole batch failed")
                if len(src) > 1 and fake.batch_none:
                    return [None] * len(src)
                return [self.one(s, images[i] if images else None) for i, s in enumerate(src)]

            def one(self, code: CodeStream, into: Wrapped | None) -> Any:
                try:
                    img = Image.open(io.BytesIO(code.data))
                    ImageFile.LOAD_TRUNCATED_IMAGES = fake.lenient
                    img.load()
                except OSError:
                    return None
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = False
                arr = np.array(img.convert("RGB"))[: img.size[1] - fake.shrink]
                if into is None:
                    return Own(arr)
                h, w = arr.shape[:2]
                into.tensor[:h, :w] = torch.from_numpy(arr)
                into.shape = (h, w, 3)
                return into

        self.DecodeParams, self.CodeStream, self.Decoder = DecodeParams, CodeStream, Decoder
        self.as_image = as_image


class FakeStream:
    cuda_stream = 12345


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCodec:
    codec = FakeCodec()
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", codec)
    return codec


def sizes_of(datas: list[bytes]) -> np.ndarray:
    """Each image's (height, width), as the loader's frame-header parse gives it; garbage: 1x1."""
    found = []
    for data in datas:
        try:
            w, h = Image.open(io.BytesIO(data)).size
        except Exception:  # noqa: BLE001 - garbage
            w, h = 1, 1
        found.append((h, w))
    return np.array(found)


def run(device: torch.device, resample: str, stream: Any) -> tuple[list[int], torch.Tensor]:
    """The batch decoded into a padded buffer (7 where nothing was written), then resized
    with the plan the loader makes, in the batch's own order."""
    datas, boxes, flips = batch()
    sizes = sizes_of(datas)
    dec = NvImageCodecDecoder(device)
    dec.start()
    buffer = torch.full((len(datas), *sizes.max(axis=0), 3), 7, dtype=torch.uint8, device=device)
    try:
        failed = dec.decode([memoryview(d) for d in datas], sizes, buffer, stream)
    finally:
        dec.close()
    plan = plan_batch(boxes, flips, sizes, H, W, resample)
    order = torch.from_numpy(plan.order).to(device)
    x = tuple(torch.from_numpy(a).to(device) for a in plan.x)
    y = tuple(torch.from_numpy(a).to(device) for a in plan.y)
    dx, nx, dy, ny = plan.digits
    resized = resize_batch(buffer[order], (*x, dx, nx), (*y, dy, ny), plan.across_first)  # type: ignore[arg-type]
    out = torch.empty_like(resized)
    out[order] = resized
    return failed, out


def check(out: torch.Tensor, resample: str, mean: float, most: int) -> None:
    datas, boxes, flips = batch()
    for i in OK:
        want = reference(resample, datas[i], tuple(boxes[i]), bool(flips[i])).astype(int)
        diff = np.abs(out[i].cpu().numpy().astype(int) - want)
        assert diff.mean() <= mean and diff.max() <= most, (i, diff.mean(), diff.max())


@pytest.mark.parametrize("external", [True, False], ids=["into-our-buffer", "copied"])
@pytest.mark.parametrize("resample", RESAMPLES)
def test_decode_gives_the_cpu_paths_pixels_and_the_failed_positions(
    fake: FakeCodec, resample: str, external: bool
) -> None:
    """Decoded into the slots of the buffer it is given (or, refused, copied there), then
    resized: the CPU path's pixels exactly (the same Pillow decode here)."""
    fake.no_images = not external
    failed, out = run(torch.device("cpu", 0), resample, FakeStream())
    assert failed == BAD
    check(out, resample, mean=0.0, most=0)
    start, *calls = fake.calls
    assert start == {"device_id": 0, "threads": 1, "options": ":fancy_upsampling=1"}
    # one batched call of the parsed JPEGs, on the caller's stream, EXIF orientation ignored
    assert calls == [
        {
            "n": 4,  # the JPEG cut short is not sent: it does not end with EOI
            "external": external,
            "stream": 12345,
            "apply_exif_orientation": False,
            "color_spec": "srgb",
            "allow_any_depth": False,
        }
    ]


def test_the_decode_writes_into_the_buffers_slots(fake: FakeCodec) -> None:
    datas, _, _ = batch()
    sizes = sizes_of(datas)
    dec = NvImageCodecDecoder(torch.device("cpu", 0))
    dec.start()
    buffer = torch.zeros((len(datas), *sizes.max(axis=0), 3), dtype=torch.uint8)
    dec.decode([memoryview(d) for d in datas], sizes, buffer, FakeStream())
    assert fake.wrapped == [buffer[i].data_ptr() for i in OK]  # PyTorch's memory, no other
    grey = buffer[1, : sizes[1][0], : sizes[1][1]]
    assert torch.equal(grey[..., 0], grey[..., 1]) and torch.equal(grey[..., 1], grey[..., 2])
    assert (buffer[1, sizes[1][0] :] == 0).all()  # below the image: untouched padding


@pytest.mark.parametrize("how", ["batch_error", "batch_none"])
def test_a_failed_batch_is_decoded_image_by_image(fake: FakeCodec, how: str) -> None:
    setattr(fake, how, True)
    failed, out = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == BAD
    check(out, "bilinear", mean=0.0, most=0)
    assert [c["n"] for c in fake.calls[1:]] == [4, 1, 1, 1, 1]


def test_a_jpeg_cut_short_is_a_failed_position_though_the_codec_would_decode_it(fake: FakeCodec) -> None:
    """nvJPEG decodes a JPEG cut in half without an error; Pillow, on the CPU path, refuses
    it: the decoder does not send it (it does not end with EOI), so that it fails here too
    and the bridge's Pillow reports it."""
    fake.lenient = True
    datas, _, _ = batch()
    assert Image.open(io.BytesIO(datas[3])).size == (160, 120)  # its header is whole
    failed, out = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == BAD
    check(out, "bilinear", mean=0.0, most=0)
    assert fake.calls[1]["n"] == 4


def test_a_decoded_image_of_another_size_is_a_failed_position(fake: FakeCodec) -> None:
    fake.shrink = True
    failed, _ = run(torch.device("cpu", 0), "bilinear", FakeStream())
    assert failed == sorted(OK + BAD)


# -- the real nvImageCodec on a CUDA GPU -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("resample", RESAMPLES)
def test_cuda_decode_matches_the_cpu_path(resample: str) -> None:
    """The JPEG cut in half, the PNG and the garbage are failed positions, as on the CPU
    path; the others within nvJPEG's IDCT against libjpeg-turbo's."""
    pytest.importorskip("nvidia.nvimgcodec")
    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.Stream(device)  # a side stream: the work must be ordered on it
    with torch.cuda.stream(stream):
        failed, out = run(device, resample, stream)
    stream.synchronize()
    assert failed == BAD
    # nvJPEG's IDCT is not libjpeg-turbo's: a few levels here and there
    check(out, resample, mean=3.0, most=39)
    assert math.isclose(float((out[1, 0] == out[1, 1]).float().mean()), 1.0)  # grey: 3 equal channels
    assert torch.equal(out[1, 1], out[1, 2])


@pytest.mark.cuda
def test_cuda_decode_succeeds_with_the_gpus_memory_in_pytorchs_cache() -> None:
    """The decode's output is PyTorch's memory: with nearly all of the GPU's free memory
    held by PyTorch's caching allocator (allocated, then freed into the cache), the batch
    still decodes on the GPU, into the buffer's slots."""
    nv = pytest.importorskip("nvidia.nvimgcodec")
    device = torch.device("cuda", torch.cuda.current_device())
    datas, _, _ = batch()
    sizes = sizes_of(datas)
    free, _ = torch.cuda.mem_get_info(device)
    hog = torch.empty(int(free * 0.97) // 4, dtype=torch.float32, device=device)
    del hog  # back to the cache, not to the driver: cudaMallocAsync now finds ~3% free
    assert torch.cuda.memory_reserved(device) > free * 0.9
    dec = NvImageCodecDecoder(device)
    dec.start()
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        buffer = torch.zeros((len(datas), *sizes.max(axis=0), 3), dtype=torch.uint8, device=device)
        failed = dec.decode([memoryview(d) for d in datas], sizes, buffer, stream)
    stream.synchronize()
    dec.close()
    assert dec.external, f"nvImageCodec {getattr(nv, '__version__', '?')} refused images="
    assert failed == BAD
    assert all(buffer[i, : sizes[i][0], : sizes[i][1]].float().mean() > 0 for i in OK)
    torch.cuda.empty_cache()

"""The CUDA batch decoder of the device decode: nvImageCodec decodes, torch crops and resizes.

Why nvImageCodec rather than ``torchvision.io.decode_jpeg(list, device="cuda")``: both decode a
batch at once on nvJPEG, with the hardware JPEG engine where the card has one (A100, H100).
But torchvision's batched GPU decode is deprecated since 0.29 in favour of TorchCodec, the
ordering of its output on the caller's stream has a known race (pytorch/vision PR #9606) and
its hardware path synchronises the host. nvImageCodec takes the CUDA stream to order its work
on, can decode only a region of interest (the crop window), is DALI's own decoding backend,
and is a PyPI wheel not tied to a torch version (``aioloader[gpu]``).

Whole images, not the crop window, by default (``roi=False``). With nvJPEG older than 13.2
(CUDA toolkit 13.3), both of nvImageCodec's GPU decoders (the hardware engine's and the
CUDA one) refuse a region of a chroma-subsampled JPEG (4:2:0, most photos) when fancy
upsampling is on: its 1-pixel edge may be wrong (their option ``enable_roi_fancy_upsampling``,
off there; one WARNING per image). Such an image then falls to nvImageCodec's CPU decoder
(libjpeg-turbo), on its one thread, the bridge's: about 2 ms of a 500x375 image, 230-240 ms
of CPU for a batch's 128 (RESULTS §29: the first GPU run, 0.54x DataLoader). Which nvJPEG a
process has is not aioloader's choice: the first one loaded serves all, and torchvision
brings its own (in §29 the cuda tests, without torchvision, printed no such WARNING; the
training benchmark, which imports torchvision first, one per image). A whole image goes to
the GPU decoders whatever the version; its crop is the resize's taps. ``roi=True`` asks for
the window; ``benchmarks/gpu_decode_profile.py`` times both and names the nvJPEG loaded.

What the API does, read in its bindings (python/decoder.cpp, code_stream.cpp, image.cpp):
``Decoder.decode(list_of_code_streams, params=, cuda_stream=)`` returns one ``Image`` or None
per stream (None: could not be parsed or decoded; it raises only for bad arguments). It
blocks the calling thread for the host side of the work (parsing, Huffman decoding on the
CPU) and leaves the GPU side queued on ``cuda_stream``; an ``Image``'s device buffer is
allocated and freed stream-ordered on that stream, and DLPack hands it to torch without a
copy (the tensor keeps the ``Image`` alive; ``__dlpack__`` orders torch's stream after it).

Resizing reproduces Pillow's ``resize(size, filter, box=box)`` (the CPU path's), not
``torch.nn.functional.interpolate``, which maps a whole tensor onto the output (a fractional
box would be off by up to a source pixel) and has no Lanczos: each axis gets Pillow's taps
(``_taps``), made on the host for the batch, applied on the GPU as two matrix products with
Pillow's rounding to 8 bits between them. The pixels differ from the CPU path's by Pillow's
fixed-point coefficients (a level at most), nvJPEG's IDCT against libjpeg-turbo's (a few
levels; chroma upsampled alike, ``fancy_upsampling=1``) and, where TF32 matrix products are
allowed (``torch.backends.cuda.matmul.allow_tf32``), a level more.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.dlpack import from_dlpack

from aioloader.decode.jpeg import jpeg_complete

__all__ = ["NvImageCodecDecoder", "inner_box", "resize_box", "roi_window"]

_MISSING = "ImageDecoder(device='cuda') needs nvImageCodec: pip install 'aioloader[gpu]'"

Box = tuple[float, float, float, float]
Floats = npt.NDArray[np.float64]


def _bilinear(x: Floats) -> Floats:
    return np.maximum(1.0 - np.abs(x), 0.0)


def _bicubic(x: Floats) -> Floats:
    a, x = -0.5, np.abs(x)  # Pillow's a = -0.5 (Resample.c)
    return np.where(
        x < 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        np.where(x < 2.0, (((x - 5.0) * x + 8.0) * x - 4.0) * a, 0.0),
    )


def _lanczos(x: Floats) -> Floats:
    return np.where(np.abs(x) < 3.0, np.sinc(x) * np.sinc(x / 3.0), 0.0)


# Pillow's filters and their supports (Resample.c); "nearest" is one tap (see _taps).
_FILTERS: dict[str, tuple[float, Callable[[Floats], Floats]]] = {
    "bilinear": (1.0, _bilinear),
    "bicubic": (2.0, _bicubic),
    "lanczos": (3.0, _lanczos),
}


def roi_window(
    box: Sequence[float], full_w: int, full_h: int, margin: tuple[float, float] = (0.0, 0.0)
) -> tuple[int, int, int, int]:
    """The integer window ``(x0, y0, x1, y1)`` (x1, y1 exclusive) of a ``full_w`` x ``full_h``
    image holding ``box`` and ``margin`` (x, y) pixels around it, clamped to the image and
    never empty: the region nvImageCodec decodes."""
    mx, my = margin
    x0 = min(max(math.floor(box[0] - mx), 0), full_w - 1)
    y0 = min(max(math.floor(box[1] - my), 0), full_h - 1)
    x1 = max(min(math.ceil(box[2] + mx), full_w), x0 + 1)
    y1 = max(min(math.ceil(box[3] + my), full_h), y0 + 1)
    return x0, y0, x1, y1


def inner_box(box: Sequence[float], window: Sequence[int]) -> Box:
    """``box`` in the pixels of ``window`` (as :func:`roi_window` gives it)."""
    return (box[0] - window[0], box[1] - window[1], box[2] - window[0], box[3] - window[1])


def _margin(lo: float, hi: float, out: int, resample: str) -> float:
    """How far beyond the box Pillow's taps reach on an axis (plus a pixel for rounding)."""
    if resample not in _FILTERS:
        return 0.0
    return _FILTERS[resample][0] * max((hi - lo) / out, 1.0) + 1.0


def _taps(
    lo: Floats, hi: Floats, size: Floats, out: int, resample: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Pillow's ``precompute_coeffs`` for a batch on one axis: output pixel ``o`` of image ``b``
    is ``sum_k weights[b, o, k] * input[index[b, o, k]]``, the box ``lo..hi`` in an input of
    ``size`` pixels (arrays of shape (B,)); both (B, out, K), K padded with zero weights."""
    scale = (hi - lo) / out
    if resample not in _FILTERS:
        # nearest: the pixel holding the output pixel's centre, the centres summed one step
        # at a time in doubles as Pillow's ImagingScaleAffine does (its rounding included).
        steps = np.repeat(scale[:, None], out, axis=1)
        steps[:, 0] = lo + scale * 0.5
        index = np.clip(np.floor(np.add.accumulate(steps, axis=1)), 0, size[:, None] - 1)[..., None]
        return index.astype(np.int64), np.ones(index.shape, np.float32)
    center = lo[:, None] + (np.arange(out) + 0.5) * scale[:, None]
    support, kernel = _FILTERS[resample]
    fscale = np.maximum(scale, 1.0)  # shrinking widens the filter
    reach = support * fscale
    first = np.maximum(np.floor(center - reach[:, None] + 0.5), 0.0)
    end = np.minimum(np.floor(center + reach[:, None] + 0.5), size[:, None])
    index = first[..., None] + np.arange(2 * math.ceil(float(reach.max())) + 1)
    weights = kernel((index - center[..., None] + 0.5) / fscale[:, None, None])
    weights = np.where(index < end[..., None], weights, 0.0)
    total = weights.sum(-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total != 0)
    index = np.minimum(index, size[:, None, None] - 1)  # padding taps: weight 0, index in range
    return index.astype(np.int64), weights.astype(np.float32)


def _dense(index: torch.Tensor, weights: torch.Tensor, size: int) -> torch.Tensor:
    """The (out, size) matrix of one image's taps on one axis."""
    return weights.new_zeros(index.shape[0], size).scatter_add_(1, index, weights)


def _round8(x: torch.Tensor) -> torch.Tensor:
    # Pillow rounds half up and clips to 8 bits after each pass (its fixed-point ss >> bits).
    return x.add_(0.5).floor_().clamp_(0.0, 255.0)


def _resize(
    chw: torch.Tensor, xs: tuple[torch.Tensor, torch.Tensor], ys: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """float (3, h, w) to float (3, out_h, out_w): horizontal pass first, as Pillow."""
    across = _round8(torch.matmul(chw, _dense(*xs, chw.shape[2]).T))
    return _round8(torch.matmul(_dense(*ys, chw.shape[1]), across))


def resize_box(hwc: torch.Tensor, box: Box, height: int, width: int, resample: str) -> torch.Tensor:
    """``box`` (x0, y0, x1, y1, in ``hwc``'s pixels) of an (h, w, C) uint8 image resized to
    (3, height, width) uint8 as Pillow's ``resize(..., box=box)``; on ``hwc``'s device. The
    decoder's own path plans a whole batch at once; this one image's path is for tests."""
    h, w = hwc.shape[0], hwc.shape[1]
    one = np.ones(1)
    x = _taps(one * box[0], one * box[2], one * w, width, resample)
    y = _taps(one * box[1], one * box[3], one * h, height, resample)
    xs, ys = [
        (torch.from_numpy(t[0][0]).to(hwc.device), torch.from_numpy(t[1][0]).to(hwc.device)) for t in (x, y)
    ]
    return _resize(_chw(hwc), xs, ys).to(torch.uint8)


def _chw(hwc: torch.Tensor) -> torch.Tensor:
    """(h, w, C) uint8 to (3, h, w) float32; one channel (grey) becomes three."""
    chw = hwc.permute(2, 0, 1)
    chw = chw.expand(3, -1, -1) if chw.shape[0] == 1 else chw[:3]
    return chw.to(torch.float32, memory_format=torch.contiguous_format)


class NvImageCodecDecoder:
    """Decodes a batch of JPEGs on a CUDA device with nvImageCodec (batched; the hardware JPEG
    engine where the card has one), then crops, resizes and flips each on the GPU.

    ``resample``: Pillow's filter of the same name (nearest, bilinear, bicubic, Lanczos),
    reproduced exactly; ``roi``: decode the crop window (and the filter's reach) alone, not
    the whole image; see the module docstring."""

    progressive = True  # nvImageCodec falls back to nvJPEG's CUDA decoder where the engine can't

    def __init__(
        self, device: torch.device, height: int, width: int, resample: str, roi: bool = False
    ) -> None:
        if resample not in ("nearest", *_FILTERS):
            raise ValueError(f"resample={resample!r} must be one of nearest, bilinear, bicubic, lanczos")
        try:
            self._nv: Any = importlib.import_module("nvidia.nvimgcodec")
        except ImportError as e:
            raise ImportError(_MISSING) from e
        self._device = torch.device(device)
        self._height, self._width, self._resample = height, width, resample
        self._roi = roi
        self._decoder: Any = None
        # The CPU path (Pillow) ignores EXIF orientation: so must this one. SRGB: interleaved
        # RGB (HWC uint8) whatever the source, grey included.
        self._params = self._nv.DecodeParams(
            apply_exif_orientation=False, color_spec=self._nv.ColorSpec.SRGB, allow_any_depth=False
        )

    def start(self) -> None:
        index = self._device.index if self._device.index is not None else torch.cuda.current_device()
        # fancy_upsampling: chroma upsampled by interpolation, as libjpeg-turbo (Pillow) does;
        # nvImageCodec 0.7 and 0.8 default to off.
        # One CPU thread for its host side (parsing; Huffman decoding where the hardware engine
        # does not take an image): no pool of the trainer's process works per batch but the
        # bridge (0 would start one thread per core).
        self._decoder = self._nv.Decoder(
            device_id=index, max_num_cpu_threads=1, options=":fancy_upsampling=1"
        )

    def close(self) -> None:
        self._decoder = None

    def decode(
        self,
        datas: list[memoryview],
        boxes: np.ndarray[Any, Any],
        flips: np.ndarray[Any, Any],
        out: list[torch.Tensor],
        stream: torch.cuda.Stream,
    ) -> list[int]:
        found = [(i, self._parse(data, boxes[i])) for i, data in enumerate(datas)]
        failed = [i for i, f in found if f is None]
        parsed = [(i, *f) for i, f in found if f is not None]
        if not parsed:
            return failed
        rows = [i for i, _, _ in parsed]
        windows = np.array([w for _, _, w in parsed], dtype=np.float64)
        inner = np.asarray(boxes, dtype=np.float64)[rows] - windows[:, [0, 1, 0, 1]]
        sizes = windows[:, 2:] - windows[:, :2]
        x = _taps(inner[:, 0], inner[:, 2], sizes[:, 0], self._width, self._resample)
        y = _taps(inner[:, 1], inner[:, 3], sizes[:, 1], self._height, self._resample)
        with torch.cuda.stream(stream):
            images = self._decode_all([cs for _, cs, _ in parsed], stream)
            # Pageable host memory with non_blocking: the copy is staged at once and ordered
            # on the stream; a blocking copy would synchronise the host with the stream.
            xi, xw, yi, yw = (torch.from_numpy(a).to(self._device, non_blocking=True) for a in (*x, *y))
            for j, (i, _, window) in enumerate(parsed):
                size = (window[3] - window[1], window[2] - window[0])
                if images[j] is None or not self._finish(
                    images[j], size, (xi[j], xw[j]), (yi[j], yw[j]), bool(flips[i]), out[i]
                ):
                    failed.append(i)
        return sorted(failed)

    def _parse(
        self, data: memoryview, box: np.ndarray[Any, Any]
    ) -> tuple[Any, tuple[int, int, int, int]] | None:
        """The code stream of ``data``'s decode window (the whole image without ``roi``) and
        the window; None where nvImageCodec can't parse it, it is no JPEG (other formats go
        to the bridge's Pillow fallback, whose colour handling the CPU path has), or it does
        not end as a whole JPEG does: nvJPEG decodes a JPEG cut short without an error,
        Pillow refuses it (the loader's screening sends such files to the CPU workers; this
        is for any other caller)."""
        nv = self._nv
        if not jpeg_complete(data):
            return None
        try:
            # A view of the caller's bytes, no copy: the code stream keeps the array alive.
            code = nv.CodeStream(np.frombuffer(data, dtype=np.uint8))
            if code.codec_name != "jpeg":
                return None
            full_w, full_h = int(code.width), int(code.height)
            if not self._roi:
                return code, (0, 0, full_w, full_h)
            lo, hi = (float(box[0]), float(box[1])), (float(box[2]), float(box[3]))
            margin = (
                _margin(lo[0], hi[0], self._width, self._resample),
                _margin(lo[1], hi[1], self._height, self._resample),
            )
            window = roi_window((*lo, *hi), full_w, full_h, margin)
            region = nv.Region(window[1], window[0], window[3], window[2])  # start_y, start_x, end_y, end_x
            return code.get_sub_code_stream(region=region), window
        except Exception:  # noqa: BLE001 - a bad image is a failed position, never the batch's failure
            return None

    def _decode_all(self, codes: list[Any], stream: torch.cuda.Stream) -> list[Any]:
        """One batched decode; where it raised, or gave nothing at all for several images
        (its whole-batch failure), each image alone to tell the bad ones from the good.

        The host waits here, as nvImageCodec requires: the call returns once its host side is
        done (parsing, CPU Huffman decoding), and its hardware decoder first waits for its
        previous batch's GPU work before reusing its state. Nothing else waits."""
        try:
            images = list(self._decoder.decode(codes, params=self._params, cuda_stream=stream.cuda_stream))
        except Exception:  # noqa: BLE001 - retried image by image below
            images = [None] * len(codes)
        if len(images) != len(codes):  # entries dropped (an image over its size limit): unaligned
            images = [None] * len(codes)
        if len(codes) == 1 or any(img is not None for img in images):
            return images
        return [self._decode_one(code, stream) for code in codes]

    def _decode_one(self, code: Any, stream: torch.cuda.Stream) -> Any:
        try:
            return self._decoder.decode(code, params=self._params, cuda_stream=stream.cuda_stream)
        except Exception:  # noqa: BLE001 - a bad image is a failed position
            return None

    def _finish(
        self,
        image: Any,
        size: tuple[int, int],
        xs: tuple[torch.Tensor, torch.Tensor],
        ys: tuple[torch.Tensor, torch.Tensor],
        flip: bool,
        out: torch.Tensor,
    ) -> bool:
        """Resize the decoded window (``size``: its height, width) into ``out``, flipped where
        asked; False where the decoded image is not the window asked for (a failed position:
        the taps index the window's pixels)."""
        # DLPack, no copy: the tensor reads the Image's buffer (and keeps it alive); torch passes
        # the current stream, which nvImageCodec orders after the decode's (here the same one).
        hwc = from_dlpack(image)
        if hwc.dim() != 3 or tuple(hwc.shape[:2]) != size or hwc.shape[2] not in (1, 3, 4):
            return False  # uint8 it is: allow_any_depth=False
        pixels = _resize(_chw(hwc), xs, ys).to(torch.uint8)
        out.copy_(torch.flip(pixels, dims=[-1]) if flip else pixels)
        return True

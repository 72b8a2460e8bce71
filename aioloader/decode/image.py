"""Built-in decoders: functions of the file's bytes that run in the worker processes."""

from __future__ import annotations

import io
import math
import types
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageFile, UnidentifiedImageError

from aioloader.decode.worker import sample_rng

__all__ = ["ImageDecoder"]

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


class ImageDecoder:
    """Decode an image file to a ``uint8`` array of shape ``(3, H, W)`` (RGB, CHW).

    ``size`` is the output ``H = W`` (an int) or ``(H, W)``. ``crop="center"`` takes the
    largest centred box with the output's aspect ratio (the same as resizing the shorter
    side and centre-cropping); ``crop="random"`` is a random-resized crop: a box of
    ``scale`` (fraction of the area) and ``ratio`` (width/height) chosen from
    :func:`aioloader.sample_rng`, then an optional horizontal flip (``hflip``, p=0.5). Crop
    and resize happen in one resampling step. Images smaller than the output are upscaled.

    With ``draft=True`` JPEGs are decoded at a reduced scale (1/2, 1/4 or 1/8, done in the
    DCT domain, several times faster) whenever that scale still covers the crop box at the
    output resolution. Any Pillow mode is converted to RGB: palette and alpha modes drop
    alpha, 16-bit greyscale is scaled to 8 bits, CMYK is converted.

    Never a partial image: a file cut short, or whose compressed data stops the decoder (a
    marker that does not belong in a JPEG's scan), raises ``OSError`` (in a
    :class:`~aioloader.Loader`, a :class:`~aioloader.DecodeError` naming the file), also
    where the training script set Pillow's ``ImageFile.LOAD_TRUNCATED_IMAGES = True``, with
    which Pillow itself fills what is missing with grey. The global is only read, never
    changed (other threads may use Pillow meanwhile), and whether it reached the process that
    decodes does not matter: workers see the script's globals as they were when its first
    loader started where the zygote was forked (its copy), Pillow's defaults where it started
    clean (a trainer with a CUDA context or intra-op threads), hot start sees them as they
    are. Damage the decoder cannot see is not caught: garbage inside a JPEG's entropy-coded
    data decodes without an error (libjpeg only warns, and Pillow does not report its
    warnings), into an image that is wrong from the damaged block row down.

    Picklable (plain attributes), so it can be sent to worker processes.

    ``device="cuda"`` (or ``"cuda:N"``, the loader's device) decodes JPEGs on the GPU: the
    loader's bridging thread decodes each batch there (nvImageCodec, batched, on the card's
    hardware JPEG engine where it has one; ``pip install 'aioloader[gpu]'``), crops, resizes
    and flips each image with the window drawn as on the CPU, so that batches equal the CPU
    path's in shape, dtype, order, labels and crop windows, and in pixels within the
    rounding of two IDCTs and resamplers (against ``draft=False``: the GPU always decodes at
    full scale, where ``draft`` lets the CPU decode at a reduced one). What the GPU cannot
    decode (PNG, CMYK, a 12-bit JPEG, a decode error) is decoded by the CPU workers, sample
    by sample, and idle CPU workers take a measured share of each batch
    (``loader.stats.device_decode``).
    ``device="cpu"`` runs that same path with Pillow on the bridging thread: for tests and
    for comparing, never faster than the workers. Needs the loader's ``device`` to be that
    device (``Loader(..., device="cuda")``) and the default ``collate``.

    Trusted code, so it declares ``hot_start``: while a loader's workers boot, it may also
    decode on a thread of the loader's process, so the first batch does not wait for them
    (a subclass inherits that). A decoder that does not declare it, a user's function among
    them, runs only in the workers.
    """

    #: Declared trusted: may decode on a thread of the loader's process while the workers
    #: boot (hot start; :func:`aioloader.decode.contract.declares_hot_start`).
    hot_start = True

    def __init__(
        self,
        size: int | tuple[int, int] = 224,
        *,
        crop: Literal["center", "random"] = "center",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: bool = False,
        draft: bool = True,
        resample: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear",
        device: str | None = None,
    ) -> None:
        if isinstance(size, int) and not isinstance(size, bool):
            h = w = size
        elif isinstance(size, tuple) and len(size) == 2:
            h, w = size
        else:
            raise ValueError(f"size={size!r} must be a positive int or a (height, width) pair of them")
        if any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in (h, w)):
            raise ValueError(f"size={size!r} must be a positive int or a (height, width) pair of them")
        if crop not in ("center", "random"):
            raise ValueError(f"crop={crop!r} must be 'center' or 'random'")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"scale={scale!r} must satisfy 0 < min <= max <= 1")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio={ratio!r} must satisfy 0 < min <= max")
        if resample not in _RESAMPLE:
            raise ValueError(f"resample={resample!r} must be one of {sorted(_RESAMPLE)}")
        if device is not None and not _is_device(device):
            raise ValueError(f"device={device!r} must be None, 'cuda', 'cuda:N' or 'cpu'")
        self.height, self.width = h, w
        self.crop = crop
        self.scale = scale
        self.ratio = ratio
        self.hflip = hflip
        self.draft = draft
        self.resample = resample
        #: Where batches are decoded (None: the CPU workers; see the class docstring).
        self.device = device

    def __repr__(self) -> str:
        on = "" if self.device is None else f", device={self.device!r}"
        return f"ImageDecoder(size=({self.height}, {self.width}), crop={self.crop!r}, draft={self.draft}{on})"

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """Shape of every decoded sample: ``(3, H, W)``, dtype uint8."""
        return (3, self.height, self.width)

    def __call__(self, data: bytes) -> npt.NDArray[np.uint8]:
        source = _Source(data)
        img = _open(source, data)
        box, flip = self.window(*img.size, sample_rng)
        return self._decode_in(img, source, box, flip)

    def window(
        self, full_w: int, full_h: int, rng: Callable[[], np.random.Generator]
    ) -> tuple[tuple[float, float, float, float], bool]:
        """``(box, flip)`` for an image of ``full_w`` x ``full_h`` pixels: the crop box
        ``(x0, y0, x1, y1)`` in its pixels (floats) and whether to flip it; ``rng()`` gives
        the sample's generator (drawn from only with ``crop="random"``)."""
        if self.crop == "center":
            return _center_box(full_w, full_h, self.width / self.height), False
        gen = rng()
        box = _random_box(gen, full_w, full_h, self.scale, self.ratio)
        return box, self.hflip and bool(gen.random() < 0.5)

    def decode_window(
        self, data: bytes, box: tuple[float, float, float, float], flip: bool
    ) -> npt.NDArray[np.uint8]:
        """``data`` decoded, ``box`` of it resized to the output, flipped if ``flip``: what
        :meth:`__call__` makes with that window (the device path's CPU fallback)."""
        source = _Source(data)
        return self._decode_in(_open(source, data), source, box, flip)

    def decode_whole(self, data: bytes) -> npt.NDArray[np.uint8]:
        """``data`` decoded whole at full scale, RGB ``(h, w, 3)``: what :meth:`decode_window`
        crops and resizes with ``draft=False`` (the device path's decode on the CPU)."""
        source = _Source(data)
        img = _open(source, data)
        _load_whole(img, source)
        return np.asarray(_to_rgb(img), dtype=np.uint8)

    def _decode_in(
        self, img: Image.Image, source: _Source, box: tuple[float, float, float, float], flip: bool
    ) -> npt.NDArray[np.uint8]:
        full_w, full_h = img.size
        if self.draft and img.format == "JPEG":
            box = self._apply_draft(img, box, full_w, full_h)
        _load_whole(img, source)
        rgb = _to_rgb(img)
        out = rgb.resize((self.width, self.height), _RESAMPLE[self.resample], box=box)
        if flip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(out, dtype=np.uint8)
        return np.ascontiguousarray(arr.transpose(2, 0, 1))

    def _apply_draft(
        self, img: Image.Image, box: tuple[float, float, float, float], full_w: int, full_h: int
    ) -> tuple[float, float, float, float]:
        """Ask for the smallest DCT scale whose crop box still has >= output pixels, and map
        the box into the reduced image's coordinates."""
        bw, bh = box[2] - box[0], box[3] - box[1]
        want = (math.ceil(full_w * self.width / bw), math.ceil(full_h * self.height / bh))
        if want[0] >= full_w and want[1] >= full_h:
            return box  # no reduction possible
        img.draft("RGB", want)
        sx, sy = img.size[0] / full_w, img.size[1] / full_h
        return (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


class _Source(io.BytesIO):
    """A file's bytes as Pillow reads them. Once ``whole`` is set (the pixels are being
    decoded), a read at the end raises, as Pillow's own loader does by default: the decoder
    asked for more than the file holds."""

    whole = False

    def read(self, size: int | None = -1, /) -> bytes:
        out = super().read(size)
        if not out and self.whole and size != 0:
            raise OSError("image file is truncated")
        return out


def _open(source: _Source, data: bytes) -> Image.Image:
    """``Image.open(source)``. A file that is no image Pillow knows is said so by its size and
    first bytes (an HTML page, a Git LFS pointer), not by the repr of ``source``, which is all
    Pillow's message would name; a :class:`~aioloader.DecodeError` names the file."""
    try:
        return Image.open(source)
    except UnidentifiedImageError:
        start = f", starting {bytes(data[:16])!r}" if data else ""
        raise UnidentifiedImageError(f"cannot identify image file ({len(data)} bytes{start})") from None


def _load_whole(img: Image.Image, source: _Source) -> None:
    """Decode ``img``'s pixels as Pillow does with ``ImageFile.LOAD_TRUNCATED_IMAGES`` False
    (its default), whatever the global says, without changing it.

    With the global set, Pillow hides two failures: a file that ends early (the JPEG plugin
    feeds the decoder an end-of-image marker instead; ``source`` raises first) and a decoder
    that stopped with an error (the generic loader ignores its error code; its own copy here
    reads the flag as False from a globals dict of its own)."""
    if not ImageFile.LOAD_TRUNCATED_IMAGES:
        img.load()
        return
    source.whole = True
    generic = ImageFile.ImageFile.load
    if type(img).load is not generic:  # a plugin's own (TIFF, WebP): it raises for a broken
        img.load()  # stream itself; an early end is the source's to catch
        return
    strict = types.FunctionType(
        generic.__code__,
        {**vars(ImageFile), "LOAD_TRUNCATED_IMAGES": False},
        generic.__name__,
        generic.__defaults__,
        generic.__closure__,
    )
    strict(img)


def _center_box(w: int, h: int, aspect: float) -> tuple[float, float, float, float]:
    """Largest centred box of width/height ``aspect``."""
    if w / h > aspect:
        bw, bh = h * aspect, float(h)
    else:
        bw, bh = float(w), w / aspect
    x0, y0 = (w - bw) / 2, (h - bh) / 2
    return (x0, y0, x0 + bw, y0 + bh)


def _random_box(
    rng: np.random.Generator, w: int, h: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[float, float, float, float]:
    """Random-resized-crop box (the Inception recipe): 10 tries, then a centre crop."""
    area = w * h
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        bw = math.sqrt(target * aspect)
        bh = math.sqrt(target / aspect)
        if 0 < bw <= w and 0 < bh <= h:
            x0 = rng.uniform(0, w - bw)
            y0 = rng.uniform(0, h - bh)
            return (x0, y0, x0 + bw, y0 + bh)
    aspect = min(max(w / h, ratio[0]), ratio[1])
    return _center_box(w, h, aspect)


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode to 8-bit RGB (alpha dropped, 16/32-bit greyscale scaled)."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I;16"):
        img = img.convert("I")
    if img.mode == "I":
        img = img.point(lambda v: v * (1 / 256)).convert("L")
    elif img.mode == "F":
        img = img.convert("L")
    elif img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # Pillow warns when a palette with transparency goes straight to RGB
    return img.convert("RGB")


def _is_device(device: object) -> bool:
    if device in ("cuda", "cpu"):
        return True
    if isinstance(device, str) and device.startswith("cuda:"):
        return device[5:].isdigit()
    return False

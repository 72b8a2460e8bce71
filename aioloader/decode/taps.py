"""Pillow's resampling taps for a batch, in Pillow's own fixed-point integers (pure NumPy).

The device decode resizes on the GPU what the CPU path resizes with Pillow's
``Image.resize(size, filter, box=box)``. To give the same pixels, not merely close ones, it
takes Pillow's arithmetic whole (``libImaging/Resample.c``): per output pixel, the taps
``precompute_coeffs`` makes (in doubles, from the box's ``float`` corners), normalised to
integers of :data:`PRECISION_BITS` fraction bits as ``normalize_coeffs_8bpc`` rounds them, a
sum of ``pixel * coefficient`` in integers, and the result rounded and clipped to 8 bits after
each pass. Pillow 13 and later run the vertical pass first where the image's height shrinks
by more than twice what its width does (:func:`vertical_first`); earlier versions always run
the horizontal one first. ``"nearest"`` is Pillow's affine scaling instead
(``ImagingScaleAffine``): one tap of coefficient ``1 << PRECISION_BITS``.

:func:`axis_taps` makes one axis's taps for a batch of boxes on the loader's side, in
parallel with training (:class:`~aioloader.decode.encoded.EncodedBatch` carries them);
:mod:`aioloader.decode.resize` applies them on the device. A horizontal flip is folded in by
reversing the output order of the x taps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import PIL

__all__ = [
    "PRECISION_BITS",
    "RESAMPLES",
    "Plan",
    "Taps",
    "axis_taps",
    "digits_for",
    "plan_batch",
    "reach",
    "vertical_first",
]

#: Fraction bits of Pillow's 8-bit coefficients (``32 - 8 - 2``).
PRECISION_BITS = 22

Floats = npt.NDArray[np.float64]


def _bilinear(x: Floats) -> Floats:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _bicubic(x: Floats) -> Floats:
    a, x = -0.5, np.abs(x)  # Pillow's a = -0.5, its operations in its order
    return np.where(
        x < 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
        np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _sinc(x: Floats) -> Floats:
    px = x * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(px) / px)


def _lanczos(x: Floats) -> Floats:
    return np.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)


#: Pillow's filters with their supports; "nearest" has none (one tap, see :func:`axis_taps`).
_FILTERS: dict[str, tuple[float, Callable[[Floats], Floats]]] = {
    "bilinear": (1.0, _bilinear),
    "bicubic": (2.0, _bicubic),
    "lanczos": (3.0, _lanczos),
}
RESAMPLES = ("nearest", *_FILTERS)


class Taps(NamedTuple):
    """One axis's taps for a batch: output pixel ``o`` of image ``b`` is
    ``sum_k coef[b, o, k] * input[pos[b, o, k]]`` in Pillow's fixed point (``coef`` in units
    of ``2**-PRECISION_BITS``). Both ``(B, out, K)`` ``int32``; a padding tap has coefficient
    0 and a position inside the image."""

    pos: npt.NDArray[np.int32]
    coef: npt.NDArray[np.int32]


#: Whether this Pillow chooses the order of its passes (13.0 and later).
_CHOOSES_ORDER = int(PIL.__version__.split(".")[0]) >= 13


def vertical_first(
    height: npt.NDArray[np.int64], width: npt.NDArray[np.int64], out_h: int, out_w: int
) -> npt.NDArray[np.bool_]:
    """Per image of ``height`` x ``width`` pixels (the whole image, not the box) resized to
    ``out_h`` x ``out_w``: whether this process's Pillow runs the vertical pass first."""
    shrink_h = np.asarray(height, np.int64) - out_h
    shrink_w = np.asarray(width, np.int64) - out_w
    if not _CHOOSES_ORDER:
        return np.zeros(shrink_h.shape, np.bool_)
    return (shrink_h > 0) & (shrink_h > shrink_w * 2)


def reach(lo: float, hi: float, out: int, resample: str) -> float:
    """How many input pixels beyond the box ``lo..hi`` the filter reads on one axis."""
    if resample not in _FILTERS:
        return 0.0
    return _FILTERS[resample][0] * max((hi - lo) / out, 1.0)


def axis_taps(lo: Floats, hi: Floats, size: npt.NDArray[np.int64], out: int, resample: str) -> Taps:
    """Pillow's taps for boxes ``lo..hi`` (shape ``(B,)``, input pixels) of inputs ``size``
    pixels long, resized to ``out`` pixels; ``resample`` one of :data:`RESAMPLES`."""
    if resample not in RESAMPLES:
        raise ValueError(f"resample={resample!r} must be one of {', '.join(RESAMPLES)}")
    # The box reaches Pillow as C floats; the scale is their difference, made a double.
    lo32, hi32 = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    scale = (hi32 - lo32).astype(np.float64) / out
    lo64 = lo32.astype(np.float64)
    size = np.asarray(size, np.int64)
    if resample == "nearest":
        return _nearest(lo64, scale, size, out)
    support, kernel = _FILTERS[resample]
    filterscale = np.maximum(scale, 1.0)
    width = support * filterscale
    ksize = 2 * math.ceil(float(width.max(initial=0.0))) + 1
    center = lo64[:, None] + (np.arange(out) + 0.5) * scale[:, None]
    first = np.maximum(np.trunc(center - width[:, None] + 0.5), 0.0)  # C's (int) truncates
    last = np.minimum(np.trunc(center + width[:, None] + 0.5), size[:, None].astype(np.float64))
    index = first[..., None] + np.arange(ksize)
    x = index - center[..., None]
    x += 0.5
    x *= (1.0 / filterscale)[:, None, None]
    weights = kernel(x)
    weights[index >= last[..., None]] = 0.0
    total = weights[..., 0].copy()
    for k in range(1, ksize):  # in C's order: the normalisation divides by this exact double
        total += weights[..., k]
    total[total == 0.0] = 1.0  # C leaves such weights as they are
    weights /= total[..., None]
    weights *= float(1 << PRECISION_BITS)
    weights += np.where(weights < 0, -0.5, 0.5)
    coef = np.trunc(weights, out=weights).astype(np.int32)
    np.minimum(index, (size - 1)[:, None, None].astype(np.float64), out=index)
    return Taps(index.astype(np.int32), coef)


def _nearest(lo: Floats, scale: Floats, size: npt.NDArray[np.int64], out: int) -> Taps:
    # ImagingScaleAffine: the source pixel of output pixel o is the integer part of
    # lo + scale/2 + o*scale, summed one step at a time in doubles as its loop does.
    steps = np.repeat(scale[:, None], out, axis=1)
    steps[:, 0] = lo + scale * 0.5
    index = np.clip(np.trunc(np.add.accumulate(steps, axis=1)), 0, (size - 1)[:, None])
    coef = np.full(index.shape, 1 << PRECISION_BITS, np.int32)
    return Taps(index.astype(np.int32)[..., None], coef[..., None])


#: TF32 keeps 11 significant bits: an integer operand of magnitude up to 2**11 is exact.
_OPERAND = 1 << 11
_LIMIT = 1 << 24  # float32 holds every integer below this exactly


def digits_for(coef: npt.NDArray[np.int32]) -> tuple[int, int]:
    """``(d, n)``: the fewest digits ``n``, then the widest ``d`` (bits), that split ``coef``
    (``(..., out, K)``) into digits of magnitude at most 2**11 with every output's sum of
    ``255 * |digit|`` below 2**24 (see the module docstring)."""
    c = np.asarray(coef, np.int64)
    # The usual case at a glance: 11-bit lower digits sum below the limit when an output has
    # at most 32 taps, and the top digit is at most |c| / 2**11 + 1.
    magnitude = np.abs(c)
    if c.shape[-1] <= 32 and int(magnitude.max(initial=0)) < (_OPERAND - 1) << 11:
        top = int((magnitude.sum(axis=-1) // (1 << 11) + c.shape[-1]).max(initial=0))
        if top * 255 < _LIMIT:
            return 11, 2
    for n in range(2, 12):
        for d in range(11, 0, -1):
            parts = _split(c, d, n)
            if int(np.abs(parts[-1]).max(initial=0)) > _OPERAND:
                break  # narrower digits leave a wider top digit
            if all(int(np.abs(x).sum(axis=-1).max(initial=0)) * 255 < _LIMIT for x in parts):
                return d, n
    raise ValueError(f"resampling taps too wide to sum exactly: {c.shape[-1]} taps")


def _split(c: npt.NDArray[np.int64], d: int, n: int) -> list[npt.NDArray[np.int64]]:
    mask = (1 << d) - 1
    return [(c >> (d * j)) & mask for j in range(n - 1)] + [c >> (d * (n - 1))]


class Plan(NamedTuple):
    """What the bridge needs to resize a batch of ``G`` decoded images, made on the loader's
    side: ``order``, the images' order in the padded buffer (those resized horizontally first,
    then the others: ``across_first`` of them); in that order, ``sizes`` ``(G, 2)`` (height,
    width; ``int32``), each axis's :class:`Taps` (flips folded into ``x``) and ``digits``
    ``(dx, nx, dy, ny)`` (:func:`digits_for`)."""

    order: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int32]
    x: Taps
    y: Taps
    digits: tuple[int, int, int, int]
    across_first: int


def plan_batch(
    boxes: Floats,
    flips: npt.NDArray[np.bool_],
    sizes: npt.NDArray[np.int64],
    out_h: int,
    out_w: int,
    resample: str,
) -> Plan:
    """The :class:`Plan` of images of ``sizes`` ``(G, 2)`` (height, width), crop ``boxes``
    ``(G, 4)`` (``x0, y0, x1, y1``) and ``flips`` resized to ``out_h`` x ``out_w``."""
    sizes = np.asarray(sizes, np.int64).reshape(-1, 2)
    order = np.argsort(vertical_first(sizes[:, 0], sizes[:, 1], out_h, out_w), kind="stable")
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)[order]
    sizes, flips = sizes[order], np.asarray(flips, np.bool_)[order]
    x = axis_taps(boxes[:, 0], boxes[:, 2], sizes[:, 1], out_w, resample)
    y = axis_taps(boxes[:, 1], boxes[:, 3], sizes[:, 0], out_h, resample)
    # A flipped image's output column o is the unflipped one's out_w - 1 - o.
    x.pos[flips] = x.pos[flips][:, ::-1]
    x.coef[flips] = x.coef[flips][:, ::-1]
    across = int(len(order) - vertical_first(sizes[:, 0], sizes[:, 1], out_h, out_w).sum())
    return Plan(order, sizes.astype(np.int32), x, y, (*digits_for(x.coef), *digits_for(y.coef)), across)

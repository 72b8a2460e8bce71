"""One batch cropped, resized and flipped in a few tensor operations, exactly as Pillow does.

The device decode (:mod:`aioloader.decode.ondevice.bridgeside`) decodes a batch's JPEGs into
one padded ``(B, Hmax, Wmax, 3)`` ``uint8`` buffer (image ``b`` in its top-left corner). Each image has
its own crop box and flip, already folded into its taps on the loader's side
(:mod:`aioloader.decode.taps`, Pillow's fixed-point coefficients). :func:`resize_batch` turns
the taps into per-image dense matrices (one scatter per axis) and applies them as two batched
matrix products, horizontal then vertical, with Pillow's rounding between them: a number of
operations that depends on the digits (below) and on the chunking, never on the batch size.

**Exact, and TF32-proof.** Pillow sums ``pixel * coefficient`` in 32-bit integers, with
coefficients of 22 fraction bits: a float32 product would round. So each coefficient is
split into ``n`` digits of ``d`` bits (the lower ones in ``0..2**d-1``, the top one signed),
and each digit's matrix is one slice of the product (``n`` times the work of one). Every
operand is then an integer of at most 11 significant bits (a pixel ``0..255``, a digit):
TF32 keeps 11 (10 stored and the implicit one), so allowing TF32 (``allow_tf32``,
``set_float32_matmul_precision("high")``) rounds no operand, and every product is exact.
:func:`~aioloader.decode.taps.digits_for` chooses ``d`` and ``n`` so that the sum of the
magnitudes of any output's products stays below ``2**24``, where float32 accumulators hold
every integer: each partial sum is exact, whatever the summation order, the blocking or
split-K of the matrix library. The digit sums are recombined in ``int64`` and rounded as
Pillow does (``(sum + 2**21) >> 22``, clipped to ``0..255``). The result is Pillow's, bit
for bit, given the same decoded pixels, on any device and with any matmul precision setting.

**Bounded temporaries.** The float copies and products of a chunk of images take
:func:`chunk_bytes` bytes per image; a batch whose whole would exceed ``max_bytes`` is
resized in chunks (each a few operations).
"""

from __future__ import annotations

import torch

from aioloader.decode.taps import PRECISION_BITS

__all__ = ["MAX_BYTES", "AxisTaps", "chunk_bytes", "resize_batch"]

#: Default bound on one chunk's temporaries (bytes).
MAX_BYTES = 512 << 20


def chunk_bytes(height: int, width: int, out_h: int, out_w: int, n: int) -> int:
    """Bytes of temporaries per image of a ``height`` x ``width`` buffer resized to
    ``out_h`` x ``out_w`` with ``n`` digits (float32 input, digit products, int64 sums, the
    dense matrices)."""
    across = 3 * height * out_w
    down = 3 * out_h * out_w
    return (
        4 * 3 * height * width
        + (4 * n + 8 + 4 + 4) * across
        + (4 * n + 8) * down
        + 4 * n * (out_w * width + out_h * height)
    )


def _dense(index: torch.Tensor, coef: torch.Tensor, size: int, d: int, n: int) -> torch.Tensor:
    """``(B, n * out, size)`` float32: each digit's dense tap matrix, digit-major."""
    b, out, k = index.shape
    c = coef.to(torch.int64)
    parts = [(c >> (d * j)) & ((1 << d) - 1) for j in range(n - 1)] + [c >> (d * (n - 1))]
    digits = torch.stack(parts, 1).to(torch.float32)  # (B, n, out, K)
    dense = torch.zeros((b, n, out, size), dtype=torch.float32, device=index.device)
    dense.scatter_add_(3, index.to(torch.int64)[:, None].expand(b, n, out, k), digits)
    return dense.view(b, n * out, size)


def _combine(sums: torch.Tensor, d: int, n: int, dim: int) -> torch.Tensor:
    """Digit sums (``n`` along ``dim``) to Pillow's 8-bit result, as float32 ``0..255``."""
    parts = sums.to(torch.int64).unbind(dim)
    total = parts[0] + (1 << (PRECISION_BITS - 1))
    for j in range(1, n):
        total += parts[j] << (d * j)
    return (total >> PRECISION_BITS).clamp_(0, 255).to(torch.float32)


AxisTaps = tuple[torch.Tensor, torch.Tensor, int, int]


def resize_batch(
    buffer: torch.Tensor, x: AxisTaps, y: AxisTaps, across_first: int, max_bytes: int = MAX_BYTES
) -> torch.Tensor:
    """``buffer`` ``(B, H, W, 3)`` ``uint8`` resized to ``(B, 3, out_h, out_w)`` ``uint8`` on its
    device. ``x``, ``y``: each axis's taps ``(pos, coef, d, n)``, ``pos`` and ``coef`` of
    shape ``(B, out, K)`` (:class:`~aioloader.decode.taps.Taps`) with their digits
    (:func:`~aioloader.decode.taps.digits_for`). The first ``across_first`` images are resized
    horizontally first, the others vertically first
    (:func:`~aioloader.decode.taps.vertical_first`). Chunked where the temporaries would
    exceed ``max_bytes``."""
    b, height, width = buffer.shape[0], buffer.shape[1], buffer.shape[2]
    out_h, out_w = y[0].shape[1], x[0].shape[1]
    per = chunk_bytes(height, width, out_h, out_w, max(x[3], y[3]))
    step = max(1, max_bytes // per)
    parts = []
    for lo, hi, fn in ((0, across_first, _across_first), (across_first, b, _down_first)):
        for i in range(lo, hi, step):
            j = min(hi, i + step)
            parts.append(fn(buffer[i:j], _rows(x, i, j), _rows(y, i, j)))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _rows(taps: AxisTaps, i: int, j: int) -> AxisTaps:
    return taps[0][i:j], taps[1][i:j], taps[2], taps[3]


def _across(planar: torch.Tensor, x: AxisTaps) -> torch.Tensor:
    """Horizontal pass: float ``(B, 3, h, W)`` to float ``(B, 3, h, out_w)``."""
    b, _, h, width = planar.shape
    xi, xc, d, n = x
    sums = torch.bmm(planar.reshape(b, 3 * h, width), _dense(xi, xc, width, d, n).transpose(1, 2))
    return _combine(sums.view(b, 3 * h, n, xi.shape[1]), d, n, 2).view(b, 3, h, xi.shape[1])


def _down(rows: torch.Tensor, y: AxisTaps) -> torch.Tensor:
    """Vertical pass: float ``(B, H, C)`` (rows, then any columns and channels) to float
    ``(B, out_h, C)``."""
    b, height, cols = rows.shape
    yi, yc, d, n = y
    sums = torch.bmm(_dense(yi, yc, height, d, n), rows)  # (B, n * out_h, C)
    return _combine(sums.view(b, n, yi.shape[1], cols), d, n, 1)


def _across_first(buffer: torch.Tensor, x: AxisTaps, y: AxisTaps) -> torch.Tensor:
    b, height = buffer.shape[0], buffer.shape[1]
    out_h, out_w = y[0].shape[1], x[0].shape[1]
    planar = buffer.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    across = _across(planar, x)  # (B, 3, H, out_w)
    rows = across.transpose(1, 2).reshape(b, height, 3 * out_w)
    return _down(rows, y).view(b, out_h, 3, out_w).permute(0, 2, 1, 3).to(torch.uint8)


def _down_first(buffer: torch.Tensor, x: AxisTaps, y: AxisTaps) -> torch.Tensor:
    b, height, width = buffer.shape[0], buffer.shape[1], buffer.shape[2]
    out_h = y[0].shape[1]
    down = _down(buffer.reshape(b, height, width * 3).to(torch.float32), y)  # (B, out_h, W * 3)
    planar = down.view(b, out_h, width, 3).permute(0, 3, 1, 2)
    return _across(planar, x).to(torch.uint8)

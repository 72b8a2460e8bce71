"""The device decode's batched crop-resize-flip (aioloader/decode/taps.py, resize.py), on CPU
tensors: the code CUDA runs, device-agnostic.

- Pillow's own pixels, bit for bit, for all four filters: odd sizes, grey, flips, boxes at the
  image's edges, upscaled and shrunk, both orders of passes (Pillow 13 chooses), chunked or
  not; the batch equal to each image resized alone (max 0);
- the taps are Pillow's coefficients (read back from Pillow's float resampler);
- TF32 changes nothing: the products with every operand rounded to TF32 are the same;
- the number of operations dispatched does not grow with the batch, and the FLOPs per image
  are bounded by the dense products' size.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from aioloader.decode import resize as resize_mod
from aioloader.decode.resize import chunk_bytes, resize_batch
from aioloader.decode.taps import RESAMPLES, axis_taps, digits_for, plan_batch, vertical_first
from aioloader.synthetic import make_image

FILTERS = {name: getattr(Image.Resampling, name.upper()) for name in RESAMPLES}
H, W = 37, 53  # odd output sizes


def images(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """``n`` RGB images of odd and even sizes, smaller and larger than the output; two grey
    ones (as RGB: three equal channels, as the decoders give them)."""
    out = []
    for i in range(n):
        img = make_image(rng, int(rng.integers(9, 190)), int(rng.integers(9, 150)))
        out.append(np.asarray(img.convert("L").convert("RGB") if i in (1, 4) else img))
    return out


def boxes_for(rng: np.random.Generator, pictures: list[np.ndarray]) -> np.ndarray:
    """Random boxes, fractional; the first the whole image, the second at the right and
    bottom edges, the third at the left and top ones, one of a few pixels (blown up)."""
    boxes = []
    for i, a in enumerate(pictures):
        h, w = a.shape[:2]
        x0, y0 = rng.uniform(0, w * 0.6), rng.uniform(0, h * 0.6)
        x1, y1 = rng.uniform(x0 + 0.5, w), rng.uniform(y0 + 0.5, h)
        boxes.append(
            [(0.0, 0.0, w, h), (x0, y0, w, h), (0.0, 0.0, x1, y1), (x0, y0, x0 + 2.5, y0 + 3.25)][min(i, 3)]
        )
    return np.array(boxes)


def pillow(a: np.ndarray, box: np.ndarray, flip: bool, resample: str) -> np.ndarray:
    out = Image.fromarray(a).resize((W, H), FILTERS[resample], box=tuple(float(v) for v in box))
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1)


def resized(
    pictures: list[np.ndarray], boxes: np.ndarray, flips: np.ndarray, resample: str, **kw: Any
) -> torch.Tensor:
    """The bridge's path: the plan, the padded buffer in the plan's order, one resize; rows
    back in the batch's order."""
    sizes = np.array([a.shape[:2] for a in pictures])
    plan = plan_batch(boxes, flips, sizes, H, W, resample)
    buffer = torch.full((len(pictures), *sizes.max(axis=0), 3), 99, dtype=torch.uint8)  # padding: garbage
    for slot, i in enumerate(plan.order):
        buffer[slot, : sizes[i][0], : sizes[i][1]] = torch.from_numpy(pictures[i].copy())
    dx, nx, dy, ny = plan.digits
    x = (torch.from_numpy(plan.x.pos), torch.from_numpy(plan.x.coef), dx, nx)
    y = (torch.from_numpy(plan.y.pos), torch.from_numpy(plan.y.coef), dy, ny)
    got = resize_batch(buffer, x, y, plan.across_first, **kw)
    out = torch.empty_like(got)
    out[torch.from_numpy(plan.order)] = got
    return out


@pytest.mark.parametrize("resample", RESAMPLES)
def test_the_batch_is_pillows_pixels_and_each_image_alone(resample: str) -> None:
    rng = np.random.default_rng(7)
    pictures = images(rng, 14)
    boxes = boxes_for(rng, pictures)
    flips = rng.random(len(pictures)) < 0.5
    whole = resized(pictures, boxes, flips, resample)
    chunked = resized(pictures, boxes, flips, resample, max_bytes=1)  # one image a chunk
    assert torch.equal(whole, chunked)
    for i, a in enumerate(pictures):
        alone = resized([a], boxes[i : i + 1], flips[i : i + 1], resample)
        assert torch.equal(whole[i], alone[0]), i
        want = pillow(a, boxes[i], bool(flips[i]), resample)
        assert np.array_equal(whole[i].numpy(), want), (i, a.shape, boxes[i], flips[i])


def test_both_orders_of_passes_are_met() -> None:
    """The images above include some Pillow 13 resizes vertically first (if it is 13)."""
    sizes = np.array([(150, 40), (40, 150), (30, 30)])
    first = vertical_first(sizes[:, 0], sizes[:, 1], H, W)
    if int(Image.__version__.split(".")[0]) >= 13:
        assert first.tolist() == [True, False, False]
    else:
        assert not first.any()


@pytest.mark.parametrize("resample", ["bilinear", "bicubic", "lanczos"])
def test_the_taps_are_pillows_coefficients(resample: str) -> None:
    """Pillow's float resampler ("F" images) with a unit impulse gives back each input
    pixel's weight in every output pixel: the taps are those, in units of 2**-22."""
    rng = np.random.default_rng(3)
    for w, out in ((120, 53), (31, 77), (224, 224)):
        x0 = float(rng.uniform(0, w / 3))
        x1 = float(rng.uniform(x0 + 1, w))
        taps = axis_taps(np.array([x0]), np.array([x1]), np.array([w]), out, resample)
        mine = np.zeros((out, w))
        np.add.at(mine, (np.arange(out)[:, None], taps.pos[0]), taps.coef[0] / 2.0**22)
        theirs = np.zeros((out, w))
        for p in range(w):
            impulse = np.zeros((1, w), np.float32)
            impulse[0, p] = 1.0
            img = Image.fromarray(impulse, mode="F").resize((out, 1), FILTERS[resample], box=(x0, 0, x1, 1))
            theirs[:, p] = np.asarray(img)[0]
        assert np.abs(mine - theirs).max() < 2.0**-21, (w, out)


def test_the_plan_orders_and_folds_the_flip() -> None:
    rng = np.random.default_rng(5)
    sizes = np.array([(150, 40), (40, 150), (60, 70)])
    boxes = np.array([(0, 0, 40, 150), (3.5, 2, 99, 40), (10, 10, 50, 60)], dtype=np.float64)
    flips = np.array([True, False, True])
    plan = plan_batch(boxes, flips, sizes, H, W, "bicubic")
    first = vertical_first(sizes[:, 0], sizes[:, 1], H, W)
    assert plan.order.tolist() == sorted(range(3), key=lambda i: bool(first[i]))
    assert plan.across_first == int((~first).sum())
    for slot, i in enumerate(plan.order):
        x = axis_taps(boxes[i : i + 1, 0], boxes[i : i + 1, 2], sizes[i : i + 1, 1], W, "bicubic")
        k = x.pos.shape[2]
        want_pos, want_coef = (x.pos[0, ::-1], x.coef[0, ::-1]) if flips[i] else (x.pos[0], x.coef[0])
        assert np.array_equal(plan.x.coef[slot][:, :k], want_coef) and not plan.x.coef[slot][:, k:].any()
        assert np.array_equal(plan.x.pos[slot][:, :k], want_pos)
        assert tuple(plan.sizes[slot]) == tuple(sizes[i])
    del rng


def test_digits_keep_every_product_and_sum_exact() -> None:
    rng = np.random.default_rng(0)
    for out, w in ((224, 500), (224, 3000), (224, 60), (8, 5000)):
        taps = axis_taps(np.array([0.0]), np.array([float(w)]), np.array([w]), out, "lanczos")
        d, n = digits_for(taps.coef)
        c = taps.coef.astype(np.int64)
        parts = [(c >> (d * j)) & ((1 << d) - 1) for j in range(n - 1)] + [c >> (d * (n - 1))]
        assert sum(p << (d * j) for j, p in enumerate(parts)).tolist() == c.tolist()
        assert max(int(np.abs(p).max()) for p in parts) <= 1 << 11  # exact in TF32
        assert max(int(np.abs(p).sum(-1).max()) for p in parts) * 255 < 1 << 24  # exact sums
    del rng


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to TF32 (10 mantissa bits, to nearest), as a TF32 matrix unit reads it."""
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32).view(t.shape)


def test_tf32_changes_no_pixel(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    pictures = images(rng, 6)
    boxes = boxes_for(rng, pictures)
    flips = rng.random(len(pictures)) < 0.5
    want = resized(pictures, boxes, flips, "lanczos")
    bmm = torch.bmm
    seen: list[bool] = []

    def tf32_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(torch.equal(_tf32(a), a) and torch.equal(_tf32(b), b))
        return bmm(_tf32(a), _tf32(b))

    monkeypatch.setattr(resize_mod.torch, "bmm", tf32_bmm)
    assert torch.equal(resized(pictures, boxes, flips, "lanczos"), want)
    assert seen and all(seen)  # no operand had bits TF32 drops


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _batch_of(n: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    pictures = [np.asarray(make_image(rng, 64, 48)) for _ in range(n)]  # one order of passes
    return pictures, boxes_for(rng, pictures), rng.random(n) < 0.5


def _counted(n: int) -> tuple[Counter[str], float]:
    pictures, boxes, flips = _batch_of(n)
    sizes = np.array([a.shape[:2] for a in pictures])
    plan = plan_batch(boxes, flips, sizes, H, W, "bilinear")
    buffer = torch.from_numpy(np.stack(pictures))
    x = (torch.from_numpy(plan.x.pos), torch.from_numpy(plan.x.coef), 11, 2)
    y = (torch.from_numpy(plan.y.pos), torch.from_numpy(plan.y.coef), 11, 2)
    with _Count() as counter:
        resize_batch(buffer, x, y, plan.across_first)
    with FlopCounterMode(display=False) as flops:
        resize_batch(buffer, x, y, plan.across_first)
    return counter.ops, flops.get_total_flops() / n


def test_the_operations_do_not_grow_with_the_batch() -> None:
    ops2, flops2 = _counted(2)
    ops64, flops64 = _counted(64)
    assert ops2 == ops64 and sum(ops2.values()) <= 64  # views and slices included
    # FLOPs per image: the two dense products of 2 digits, nothing per pixel beyond them
    bound = 2 * 2 * 3 * (48 * 64 * W + H * 48 * W)
    assert 0 < flops64 <= bound and flops2 == flops64


def test_chunks_bound_the_temporaries() -> None:
    per = chunk_bytes(375, 500, 224, 224, 2)
    assert 8 << 20 < per < 16 << 20  # about 10 MB an image of 500x375
    pictures, boxes, flips = _batch_of(8)
    counted: list[int] = []
    real = resize_mod._across_first

    def spy(buffer: torch.Tensor, x: Any, y: Any) -> torch.Tensor:
        counted.append(buffer.shape[0])
        return real(buffer, x, y)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resize_mod, "_across_first", spy)
        resized(pictures, boxes, flips, "bilinear", max_bytes=3 * chunk_bytes(48, 64, H, W, 2))
    assert counted == [3, 3, 2]


@pytest.mark.cuda
@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
def test_on_cuda_with_or_without_tf32_the_pixels_are_pillows(
    tf32: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(13)
    pictures = images(rng, 10)
    boxes = boxes_for(rng, pictures)
    flips = rng.random(len(pictures)) < 0.5
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    device = torch.device("cuda", torch.cuda.current_device())
    sizes = np.array([a.shape[:2] for a in pictures])
    plan = plan_batch(boxes, flips, sizes, H, W, "bicubic")
    buffer = torch.zeros((len(pictures), *sizes.max(axis=0), 3), dtype=torch.uint8)
    for slot, i in enumerate(plan.order):
        buffer[slot, : sizes[i][0], : sizes[i][1]] = torch.from_numpy(pictures[i].copy())
    dx, nx, dy, ny = plan.digits
    x = (torch.from_numpy(plan.x.pos).to(device), torch.from_numpy(plan.x.coef).to(device), dx, nx)
    y = (torch.from_numpy(plan.y.pos).to(device), torch.from_numpy(plan.y.coef).to(device), dy, ny)
    got = resize_batch(buffer.to(device), x, y, plan.across_first).cpu()
    for slot, i in enumerate(plan.order):
        assert np.array_equal(got[slot].numpy(), pillow(pictures[i], boxes[i], bool(flips[i]), "bicubic"))

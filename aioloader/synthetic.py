"""Synthetic ImageFolder datasets of real JPEG files, for the demo, benchmarks and tests.

Images are smooth colour gradients plus noise, so they compress like photographs (about
100 KB at 500x375, quality 90) rather than like flat colour (a few KB) or pure noise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from aioloader.observe.progressbar import terminal_bar

__all__ = ["make_image", "make_image_folder"]


def make_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """One RGB test image: a random gradient with noise and a few bright blocks."""
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    a, b, c = rng.random((3, 1, 1, 3), dtype=np.float32)
    img = 255.0 * (a * x + b * y + c * x * y) / (a + b + c)
    img = img + rng.normal(0.0, 18.0, size=(height, width, 3)).astype(np.float32)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        img[y0 : y0 + height // 6, x0 : x0 + width // 6] = rng.random(3, dtype=np.float32) * 255
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def make_image_folder(
    root: str | os.PathLike[str],
    *,
    num_images: int,
    num_classes: int = 10,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    seed: int = 0,
    progress: bool = False,
    on_image: Callable[[int], object] | None = None,
) -> Path:
    """Write ``num_images`` JPEGs of ``size`` (width, height) into ``root/class_XX/`` folders;
    with ``progress``, a bar on stderr when it is a terminal. ``on_image``, if given, is
    called with the count written after each image (the demo's progress lines where no bar
    is drawn).

    Idempotent: a folder that already holds a complete set (marked by ``.complete``) is
    reused, so demos and benchmarks generate their data once.
    """
    top = Path(root)
    marker = top / ".complete"
    stamp = f"{num_images} {num_classes} {size[0]}x{size[1]} q{quality} seed{seed}"
    if marker.is_file() and marker.read_text() == stamp:
        return top
    rng = np.random.default_rng(seed)
    for i in terminal_bar(range(num_images), progress, desc="generating JPEGs", unit="img"):
        folder = top / f"class_{i % num_classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        make_image(rng, *size).save(folder / f"img_{i:06d}.jpg", quality=quality)
        if on_image is not None:
            on_image(i + 1)
    marker.write_text(stamp)
    return top

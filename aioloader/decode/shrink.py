"""The sample cache's downscale (``Cache(max_side=N)``), made in a decode worker just before
the sample's first decode, which then decodes the small image (as every later epoch will):
the file's bytes in, the bytes to keep out.

- An image of a format Pillow knows as JPEG, MPO, PNG, WebP, BMP or TIFF, larger than ``N``
  on its longer side, is kept re-encoded as a baseline JPEG at ``quality``: the longer side
  ``N`` pixels, the other scaled alike (at least 1), EXIF orientation applied once (as
  ``ImageOps.exif_transpose`` shows the file: Pillow's TIFF reader applies it itself as it
  loads, the other formats leave it to us; the EXIF block, orientation included, is not
  kept; the ICC profile is), in RGB or, for a grey
  image, L. A JPEG is decoded at a reduced scale (Pillow's ``draft``: 1/2, 1/4 or 1/8 in the
  DCT domain) whenever that still covers ``N``, so the reduction costs a fraction of a full
  decode.
- An image already within ``N`` with no orientation to apply, and any other file, is kept
  as it is (:func:`shrink` returns None): never enlarged, never re-encoded for nothing.
- An image Pillow recognises but cannot decode raises: the sample is then not cached.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

__all__ = ["FORMATS", "shrink", "target_size"]

#: Formats (Pillow's names) that are kept re-encoded.
FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP", "TIFF"})
_ORIENTATION = 0x0112
T = Image.Transpose
#: EXIF orientation -> the transpose that shows the image upright (as ImageOps.exif_transpose).
_TRANSPOSE = {
    2: T.FLIP_LEFT_RIGHT,
    3: T.ROTATE_180,
    4: T.FLIP_TOP_BOTTOM,
    5: T.TRANSPOSE,
    6: T.ROTATE_270,
    7: T.TRANSVERSE,
    8: T.ROTATE_90,
}


def target_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """``(width, height)`` scaled so the longer side is ``max_side`` (aspect kept, each at
    least 1); unchanged when already within it."""
    longer = max(width, height)
    if longer <= max_side:
        return width, height
    return max(1, round(width * max_side / longer)), max(1, round(height * max_side / longer))


def shrink(data: bytes | memoryview, max_side: int, quality: int) -> bytes | None:
    """The bytes the cache keeps for a file of ``data``: a smaller JPEG, or None to keep
    ``data`` as it is (see the module)."""
    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError):
        return None  # not an image Pillow knows: cached as it is
    with img:
        if img.format not in FORMATS:
            return None
        tagged = img.getexif().get(_ORIENTATION, 1) in _TRANSPOSE
        # ``img.size`` is the size as stored, except for a TIFF (upright already): either way
        # the size of the pixels ``load()`` gives, which are scaled before any turn.
        target = target_size(img.width, img.height, max_side)
        if target == img.size and not tagged:
            return None
        mode = "L" if img.mode in ("L", "LA", "1", "I;16", "I;16B", "I;16L", "I") else "RGB"
        if img.format in ("JPEG", "MPO"):
            img.draft(mode, target)  # reduced-scale DCT decode: at least ``target``
        img.load()
        icc = img.info.get("icc_profile")
        out = _eight_bit(img, mode)
        if out.size != target:
            # Bicubic (antialiased when reducing): a third cheaper than Lanczos, and the image
            # is resampled again by the decode anyway.
            out = out.resize(target, Image.Resampling.BICUBIC)
        # Read again once loaded: Pillow's TIFF reader turns the pixels upright as it loads
        # (and reports the upright size from the start), then drops the tag; the other
        # formats keep it and leave the turn to us.
        turn = _TRANSPOSE.get(img.getexif().get(_ORIENTATION, 1))
        if turn is not None:
            out = out.transpose(turn)
        buf = io.BytesIO()
        out.save(buf, "JPEG", quality=quality, icc_profile=icc)
        return buf.getvalue()


def _eight_bit(img: Image.Image, mode: str) -> Image.Image:
    """``img`` in 8-bit ``mode``: 16-bit grey scaled (not clipped), alpha dropped."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(img, dtype=np.int64)
        return Image.fromarray((np.clip(a, 0, 65535) >> 8).astype(np.uint8), "L")
    return img if img.mode == mode else img.convert(mode)

"""What a file's first bytes say about decoding it on the GPU (pure: no I/O, no library).

The device decode (:mod:`aioloader.decode.ondevice.loaderside`) screens each sample in the
loader process before its bytes travel to the trainer: a JPEG the GPU decoders handle goes there, and
anything else (PNG, WebP, a CMYK or 12-bit JPEG, a lossless or arithmetic-coded one, bytes
that are no image) goes to the CPU workers, which decode every format Pillow knows. Reading
the markers up to the frame header costs microseconds, a decode milliseconds.

A JPEG is a sequence of markers ``FF xx``; all but SOI/EOI/RSTn carry a 2-byte big-endian
length (that includes itself). The frame header (SOFn) holds the precision, height, width and
number of components; its ``n`` says the coding: 0 baseline, 1 extended, 2 progressive, 3
lossless, 5-7 hierarchical, 9-15 arithmetic.

A whole JPEG ends with EOI (``FF D9``), which cannot occur inside its entropy-coded data
(an ``FF`` there is followed by ``00`` or a restart marker). nvJPEG decodes a JPEG cut short
without an error, where Pillow refuses it: so a file that does not end with EOI (padding
bytes ``00`` or ``FF`` after it allowed, as some cameras write) goes to the CPU workers, which
decode it or report it as any corrupt file (:func:`jpeg_complete`). Data after the end other
than padding (a motion photo's video, say) sends the file to the CPU workers too: they decode
it, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JpegHeader", "jpeg_complete", "jpeg_header", "not_on_device"]

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7
#: Markers read before giving up on finding the frame header (EXIF, ICC, comments, ...).
_MAX_MARKERS = 64
#: Bytes a writer may leave after EOI (a file padded to a block size).
_PADDING = b"\x00\xff"


@dataclass(frozen=True)
class JpegHeader:
    """A JPEG's frame header: ``sof`` (0-15, see the module), ``precision`` in bits,
    ``height`` and ``width`` in pixels, ``components`` (1 grey, 3 YCbCr, 4 CMYK/YCCK)."""

    sof: int
    precision: int
    height: int
    width: int
    components: int


def jpeg_header(data: bytes | memoryview) -> JpegHeader | None:
    """The frame header of the JPEG ``data`` starts with; None when it is not one, or its
    header cannot be found in its first markers."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    at = 2
    for _ in range(_MAX_MARKERS):
        while at < len(data) and data[at] == 0xFF and at + 1 < len(data) and data[at + 1] == 0xFF:
            at += 1  # fill bytes before a marker
        if at + 4 > len(data) or data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in _NO_LENGTH:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or the scan began without a frame header
            return None
        length = (data[at + 2] << 8) | data[at + 3]
        if marker in _SOF:
            if at + 10 > len(data) or length < 8:
                return None
            height = (data[at + 5] << 8) | data[at + 6]
            width = (data[at + 7] << 8) | data[at + 8]
            return JpegHeader(marker - 0xC0, data[at + 4], height, width, data[at + 9])
        if length < 2:
            return None
        at += 2 + length
    return None


def jpeg_complete(data: bytes | memoryview) -> bool:
    """Whether ``data`` ends as a whole JPEG does: with EOI (``FF D9``), then nothing but
    padding (``00`` or ``FF`` bytes). False for a file cut short (see the module docstring)."""
    n = len(data)
    if n >= 2 and data[n - 2] == 0xFF and data[n - 1] == 0xD9:
        return True  # the common case, without a copy
    if n < 2 or data[n - 1] not in _PADDING:
        return False
    end = len(bytes(data).rstrip(_PADDING))
    return end >= 2 and data[end - 2] == 0xFF and data[end - 1] == 0xD9


def not_on_device(header: JpegHeader | None, progressive: bool = True, complete: bool = True) -> str | None:
    """Why a sample with ``header`` is decoded on the CPU rather than the GPU (a short reason,
    counted in ``stats``), or None when the GPU takes it. ``progressive``: the device's
    decoder takes progressive JPEGs too; ``complete``: the file ends as a whole JPEG does
    (:func:`jpeg_complete`)."""
    if header is None:
        return "not a JPEG"
    if not complete:
        return "JPEG without its end"
    if header.sof not in (0, 1, 2) or (header.sof == 2 and not progressive):
        return f"JPEG coding SOF{header.sof}"
    if header.precision != 8:
        return f"{header.precision}-bit JPEG"
    if header.components not in (1, 3):
        return f"JPEG with {header.components} components"
    if header.width == 0 or header.height == 0:
        return "JPEG without its size"
    return None

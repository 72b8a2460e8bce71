"""The device decode, ``ImageDecoder(device=...)``, in one place: its loader side, its bridge
side, and the one test of whether a loader has it.

| module | role |
| --- | --- |
| ``loaderside.py`` | the stage in the loader: what the GPU decodes, what the CPU workers, the windows |
| ``bridgeside.py`` | on the bridge: a half-decoded batch begun on the decode thread, finished on the device |

The rest of the device decode is ``decode/``'s (what it screens, plans and decodes with:
``jpeg.py``, ``hybrid.py``, ``encoded.py``, ``taps.py``, ``resize.py``, ``batchdec.py``,
``nvimgcodec.py``); the threads it runs on are ``run/``'s (the bridge, which makes its
:class:`~aioloader.decode.ondevice.bridgeside.DeviceDecode`, and the decode thread,
``run/decodeahead.py``).

This module holds the predicate every part asks, :func:`decodes_on_device` (with
:func:`device_of` where the device itself is needed): the arguments' checks, the settled
device, the decode stage's choice, the bridge's, and the wings below ``decode/`` through
``LoaderConfig.decodes_on_device``. It imports only
``image.py`` (as ``config.py`` does), not its two sides: they load where they run.
"""

from __future__ import annotations

from typing import TypeGuard

from aioloader.decode.image import ImageDecoder

__all__ = ["decodes_on_device", "device_of"]


def device_of(decode: object) -> str | None:
    """The device ``decode`` decodes on: an ``ImageDecoder``'s ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:N"``), or None: the CPU workers, as for any other decoder."""
    return decode.device if isinstance(decode, ImageDecoder) else None


def decodes_on_device(decode: object) -> TypeGuard[ImageDecoder]:
    """Whether ``decode`` decodes on a device (``ImageDecoder(device=...)``): its JPEGs
    travel encoded to the bridge, which decodes each batch there. The one test of it."""
    return device_of(decode) is not None

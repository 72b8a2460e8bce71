"""Batch decoders: the part of the device decode that turns a batch's JPEGs into pixels.

The decode thread (:mod:`aioloader.run.decodeahead`) hands a batch decoder the encoded
images of a batch, their sizes (height, width, from their frame headers on the loader's side)
and one padded ``(G, Hmax, Wmax, 3)`` ``uint8`` buffer on the device; the decoder writes image
``i``, whole, RGB, into ``buffer[i, :height, :width]`` and says which images failed (those the
bridge decodes again with Pillow). The crop, resize and flip come after, for the whole batch
at once (:mod:`aioloader.decode.resize`). Which decoder is a part, chosen by the
``ImageDecoder``'s ``device`` (:func:`batch_decoder_for`):

- ``"cuda"``: :class:`~aioloader.decode.nvimgcodec.NvImageCodecDecoder` (nvImageCodec,
  batched, the hardware JPEG engine where the card has one; ``aioloader[gpu]``);
- ``"cpu"``: :class:`PillowBatchDecoder`, Pillow on the decode thread: the same stage,
  ordering, resize, fallbacks and stats, run by CI without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from aioloader.decode.image import ImageDecoder

__all__ = ["BatchDecoder", "PillowBatchDecoder", "batch_decoder_for"]


class BatchDecoder(Protocol):
    """Decodes batches of encoded images on one device (see the module docstring)."""

    #: Whether it takes progressive JPEGs (the loader's screening asks).
    progressive: bool

    def start(self) -> None:
        """On the bridging thread, once its device is bound: make the decoder's state."""

    def decode(
        self, datas: Sequence[memoryview], sizes: np.ndarray[Any, Any], buffer: torch.Tensor, stream: Any
    ) -> list[int]:
        """Decode ``datas[i]`` (an image of ``sizes[i]`` = height, width) into
        ``buffer[i, :height, :width]`` as RGB, the work enqueued on ``stream`` (None on the
        CPU). Returns the positions that failed; never raises for a bad image."""

    def close(self) -> None:
        """Release what :meth:`start` made."""


class PillowBatchDecoder:
    """The CPU path's decode (:meth:`ImageDecoder.decode_whole`), image by image: exactly
    the pixels the workers resize."""

    progressive = True

    def __init__(self, decoder: ImageDecoder) -> None:
        self._decoder = decoder

    def start(self) -> None:
        pass

    def decode(
        self, datas: Sequence[memoryview], sizes: np.ndarray[Any, Any], buffer: torch.Tensor, stream: Any
    ) -> list[int]:
        failed = []
        for i, data in enumerate(datas):
            try:
                pixels = self._decoder.decode_whole(bytes(data))
            except Exception:  # noqa: BLE001 - a bad image is a failed position, decoded again by the bridge
                failed.append(i)
                continue
            h, w = int(sizes[i][0]), int(sizes[i][1])
            if pixels.shape != (h, w, 3):
                failed.append(i)
                continue
            np.copyto(buffer[i, :h, :w].numpy(), pixels)  # NumPy's copy: one thread, not the intra-op pool
        return failed

    def close(self) -> None:
        pass


def batch_decoder_for(decoder: ImageDecoder, device: torch.device) -> BatchDecoder:
    """The batch decoder for ``decoder`` on ``device``; ImportError naming the extra where
    the GPU library is missing."""
    if device.type == "cpu":
        return PillowBatchDecoder(decoder)
    from aioloader.decode.nvimgcodec import NvImageCodecDecoder  # the GPU library only when asked

    found: BatchDecoder = NvImageCodecDecoder(device)
    return found

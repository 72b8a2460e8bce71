"""Batch decoders: the part of the device decode that turns a batch's JPEGs into pixels.

The bridging thread (:mod:`aioloader.run.devdecode`) hands a batch decoder the encoded
images of a batch, their crop windows and flips, and one output view per image; the decoder
writes each ``(3, H, W)`` RGB ``uint8`` result into its view and says which images failed
(those the bridge decodes again with Pillow). Which decoder is a part, chosen by the
``ImageDecoder``'s ``device`` (:func:`batch_decoder_for`):

- ``"cuda"``: :class:`~aioloader.decode.nvimgcodec.NvImageCodecDecoder` (nvImageCodec,
  batched, the hardware JPEG engine where the card has one; ``aioloader[gpu]``);
- ``"cpu"``: :class:`PillowBatchDecoder`, the CPU path's own code on the bridging thread: the
  same stage, ordering, fallbacks and stats, run by CI without a GPU.
"""

from __future__ import annotations

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
        self,
        datas: list[memoryview],
        boxes: np.ndarray[Any, Any],
        flips: np.ndarray[Any, Any],
        out: list[torch.Tensor],
        stream: Any,
    ) -> list[int]:
        """Decode ``datas[i]``, resize its ``boxes[i]`` (``x0, y0, x1, y1`` in its pixels)
        to ``out[i]``'s ``(3, H, W)``, flip it where ``flips[i]``, write it into ``out[i]``;
        the work is enqueued on ``stream``. Returns the positions that failed (their
        ``out`` untouched); never raises for a bad image."""

    def close(self) -> None:
        """Release what :meth:`start` made."""


class PillowBatchDecoder:
    """The CPU path's decode (``ImageDecoder.decode_window``), image by image: exactly the
    pixels the workers make."""

    progressive = True

    def __init__(self, decoder: ImageDecoder) -> None:
        self._decoder = decoder

    def start(self) -> None:
        pass

    def decode(
        self,
        datas: list[memoryview],
        boxes: np.ndarray[Any, Any],
        flips: np.ndarray[Any, Any],
        out: list[torch.Tensor],
        stream: Any,
    ) -> list[int]:
        failed = []
        for i, data in enumerate(datas):
            x0, y0, x1, y1 = (float(v) for v in boxes[i])
            try:
                pixels = self._decoder.decode_window(bytes(data), (x0, y0, x1, y1), bool(flips[i]))
            except Exception:  # noqa: BLE001 - a bad image is a failed position, decoded again by the bridge
                failed.append(i)
                continue
            np.copyto(out[i].numpy(), pixels)  # NumPy's copy: one thread, not the intra-op pool
        return failed

    def close(self) -> None:
        pass


def batch_decoder_for(decoder: ImageDecoder, device: torch.device) -> BatchDecoder:
    """The batch decoder for ``decoder`` on ``device``; ImportError naming the extra where
    the GPU library is missing."""
    if device.type == "cpu":
        return PillowBatchDecoder(decoder)
    from aioloader.decode.nvimgcodec import NvImageCodecDecoder  # the GPU library only when asked

    found: BatchDecoder = NvImageCodecDecoder(device, decoder.height, decoder.width, decoder.resample)
    return found

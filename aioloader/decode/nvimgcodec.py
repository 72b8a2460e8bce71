"""The CUDA batch decoder of the device decode: nvImageCodec decodes a batch into PyTorch's memory.

Why nvImageCodec rather than ``torchvision.io.decode_jpeg(list, device="cuda")``: both decode a
batch at once on nvJPEG, with the hardware JPEG engine where the card has one (A100, H100).
But torchvision's batched GPU decode is deprecated since 0.29 in favour of TorchCodec, the
ordering of its output on the caller's stream has a known race (pytorch/vision PR #9606) and
its hardware path synchronises the host. nvImageCodec takes the CUDA stream to order its work
on, decodes into buffers the caller owns, is DALI's own decoding backend, and is a PyPI wheel
not tied to a torch version (``aioloader[gpu]``).

Whole images, never a region: with nvJPEG older than 13.2 (CUDA toolkit 13.3), both of
nvImageCodec's GPU decoders refuse a region of a chroma-subsampled JPEG (4:2:0, most photos)
when fancy upsampling is on, and the image then falls to nvImageCodec's CPU decoder on its one
thread (RESULTS §29). The crop is the resize's taps (:mod:`aioloader.decode.resize`).

**Into PyTorch's memory.** The batch's images are decoded into one padded ``(G, Hmax, Wmax,
3)`` ``uint8`` tensor PyTorch allocated (image ``i`` in the top-left corner of slot ``i``):
each slot is wrapped with ``nvimgcodec.as_image`` (zero copy, ``__cuda_array_interface__``)
and passed in ``decode(..., images=)``, which decodes into a buffer that holds the image at
the buffer's own row pitch (nvImageCodec 0.7 and later). So the decode's output comes from
PyTorch's caching allocator, the trainer's pool, not from nvImageCodec's own
``cudaMallocAsync`` allocations, which fail once the trainer's cache holds the GPU's memory.
Where ``images=`` is refused (an older nvImageCodec), each image is decoded into its own
buffer and copied into its slot (one copy per image).

What the API does, read in its bindings (python/decoder.cpp, image.cpp, module.cpp):
``Decoder.decode(code_streams, images=, params=, cuda_stream=)`` returns one ``Image`` or
None per stream (None: could not be parsed or decoded; it raises only for bad arguments). It
blocks the calling thread for the host side of the work (parsing, Huffman decoding on the
CPU) and leaves the GPU side queued on ``cuda_stream``; an external buffer made with the same
stream is written stream-ordered, without a host synchronisation.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from aioloader.decode.jpeg import jpeg_complete

__all__ = ["NvImageCodecDecoder"]

_MISSING = "ImageDecoder(device='cuda') needs nvImageCodec: pip install 'aioloader[gpu]'"


class NvImageCodecDecoder:
    """Decodes a batch of JPEGs on a CUDA device with nvImageCodec (batched; the hardware JPEG
    engine where the card has one) into slots of a padded buffer (see the module docstring);
    a :class:`~aioloader.decode.batchdec.BatchDecoder`."""

    progressive = True  # nvImageCodec falls back to nvJPEG's CUDA decoder where the engine can't

    def __init__(self, device: torch.device) -> None:
        try:
            self._nv: Any = importlib.import_module("nvidia.nvimgcodec")
        except ImportError as e:
            raise ImportError(_MISSING) from e
        self._device = torch.device(device)
        self._decoder: Any = None
        #: Whether ``decode(..., images=)`` takes our buffers (False after it refused them).
        self.external = True
        # The CPU path (Pillow) ignores EXIF orientation: so must this one. SRGB: interleaved
        # RGB (HWC uint8) whatever the source, grey included.
        self._params = self._nv.DecodeParams(
            apply_exif_orientation=False, color_spec=self._nv.ColorSpec.SRGB, allow_any_depth=False
        )

    def start(self) -> None:
        index = self._device.index if self._device.index is not None else torch.cuda.current_device()
        # fancy_upsampling: chroma upsampled by interpolation, as libjpeg-turbo (Pillow) does;
        # nvImageCodec 0.7 and 0.8 default to off.
        # One CPU thread for its host side (parsing; Huffman decoding where the hardware engine
        # does not take an image): no pool of the trainer's process works per batch but the
        # loader's own threads (0 would start one thread per core).
        self._decoder = self._nv.Decoder(
            device_id=index, max_num_cpu_threads=1, options=":fancy_upsampling=1"
        )

    def close(self) -> None:
        self._decoder = None

    def decode(
        self, datas: Sequence[memoryview], sizes: np.ndarray[Any, Any], buffer: torch.Tensor, stream: Any
    ) -> list[int]:
        codes = [self._parse(data, sizes[i]) for i, data in enumerate(datas)]
        pos = [i for i, code in enumerate(codes) if code is not None]
        failed = [i for i, code in enumerate(codes) if code is None]
        if not pos:
            return failed
        handle = stream.cuda_stream if stream is not None else 0
        slots = [buffer[i] for i in pos]
        images = self._decode_all([codes[i] for i in pos], slots, handle)
        for j, i in enumerate(pos):
            h, w = int(sizes[i][0]), int(sizes[i][1])
            if images[j] is None or tuple(images[j].shape) != (h, w, 3):
                failed.append(i)  # uint8 it is (allow_any_depth=False); grey came as RGB
            elif not self.external:
                slots[j][:h, :w].copy_(from_dlpack(images[j]))
        return sorted(failed)

    def _parse(self, data: memoryview, size: Sequence[int]) -> Any:
        """``data``'s code stream; None where nvImageCodec can't parse it, it is no JPEG, it
        is not the size its frame header said on the loader's side, or it does not end as a
        whole JPEG does: nvJPEG decodes a JPEG cut short without an error, Pillow refuses it
        (the loader's screening sends such files to the CPU workers; this is for any other
        caller)."""
        if not jpeg_complete(data):
            return None
        try:
            # A view of the caller's bytes, no copy: the code stream keeps the array alive.
            code = self._nv.CodeStream(np.frombuffer(data, dtype=np.uint8))
            if code.codec_name != "jpeg" or (int(code.height), int(code.width)) != (
                int(size[0]),
                int(size[1]),
            ):
                return None
            return code
        except Exception:  # noqa: BLE001 - a bad image is a failed position, never the batch's failure
            return None

    def _decode_all(self, codes: list[Any], slots: list[torch.Tensor], handle: int) -> list[Any]:
        """One batched decode into ``slots``; where it raised, or gave nothing at all for several
        images (its whole-batch failure), each image alone to tell the bad ones from the good."""
        images = self._call(codes, slots, handle)
        if images is None or len(images) != len(codes):  # raised, or entries dropped: unaligned
            images = [None] * len(codes)
        if len(codes) == 1 or any(img is not None for img in images):
            return images
        return [(self._call([c], [s], handle) or [None])[0] for c, s in zip(codes, slots, strict=True)]

    def _call(self, codes: list[Any], slots: list[torch.Tensor], handle: int) -> list[Any] | None:
        nv, params = self._nv, self._params
        if self.external:
            try:
                images = [nv.as_image(slot, handle) for slot in slots]
                return list(self._decoder.decode(codes, images=images, params=params, cuda_stream=handle))
            except (TypeError, AttributeError):  # no images= (or as_image): its own buffers, copied
                self.external = False
            except Exception:  # noqa: BLE001 - retried image by image, or failed positions
                return None
        try:
            return list(self._decoder.decode(codes, params=params, cuda_stream=handle))
        except Exception:  # noqa: BLE001
            return None

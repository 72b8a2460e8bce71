"""Stage 3, decoding, in one place: the worker processes and what crosses to them, and the
device decode (both its sides, in ``ondevice/``).

| module | role |
| --- | --- |
| ``contract.py`` | what the engine and the tuner ask of any stage: ``DecodeStageLike``, ``DecodeRequest`` |
| ``stage.py`` | the local stage the engine awaits: slots, hot start, timeouts, crashes, resubmission |
| ``faults.py`` | pure: what a worker's death makes of each row in flight: again, timed out, poison |
| ``chunk.py`` | what crosses to a worker and back: the ``Chunk`` task (its ``Shrink``), the answers |
| ``worker.py`` | inside a worker: the installed ``decode``, ``sample_rng``, its lifeline |
| ``pool.py`` | the worker processes: forkserver start in the background, crash recovery, bounded shutdown |
| ``image.py`` | ``ImageDecoder``: Pillow decode with JPEG draft mode, any mode to RGB, crops |
| ``ondevice/`` | ``ImageDecoder(device=...)``: its loader side, its bridge side, ``decodes_on_device`` |
| ``jpeg.py`` | pure: a JPEG's frame header, and whether the device takes it |
| ``hybrid.py`` | pure: the CPU workers' share of each batch beside the GPU, steered by the trainer's wait |
| ``encoded.py`` | encoded images and the half-decoded batch that crosses to the bridge, with its plan |
| ``taps.py`` | pure: Pillow's fixed-point resampling taps for a batch, the resize's plan |
| ``resize.py`` | a batch's crop-resize-flip in a few tensor operations, Pillow-exact, TF32-proof |
| ``batchdec.py`` | batch decoders: a batch's JPEGs into a padded buffer on the device (Pillow's for CI) |
| ``shrink.py`` | ``Cache(max_side=N)``: the small JPEG a worker makes, then decodes |
| ``nvimgcodec.py`` | ``NvImageCodecDecoder``: a batch's JPEGs decoded on a GPU into PyTorch's memory |
| ``settings.py`` | ``Decoding``: the decoding part's settings (``decode``, workers, where, restarts) |

The memory they decode into is ``memory/``'s; the processes come from ``procs/``.

Nothing here is imported eagerly: a worker imports ``worker.py`` (NumPy) and only what its
decoder needs; ``ImageDecoder`` (Pillow) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aioloader.decode.image import ImageDecoder

__all__ = ["ImageDecoder"]


def __getattr__(name: str) -> Any:
    if name == "ImageDecoder":
        from aioloader.decode.image import ImageDecoder

        return ImageDecoder
    raise AttributeError(f"module 'aioloader.decode' has no attribute {name!r}")

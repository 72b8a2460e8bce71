"""Stage 3, decoding, in one place: the worker processes and what crosses to them.

| module | role |
| --- | --- |
| ``stage.py`` | the stage the engine awaits: slots, hot start, timeouts, crashes, resubmission |
| ``protocol.py`` | what crosses to a worker: the ``Chunk`` task, typed row results, the status table |
| ``layout.py`` | pure: where samples go in a slab; the layout learned from the samples themselves |
| ``slabs.py`` | shared-memory batch slabs and their pool |
| ``segments.py`` | the memory under a slab (memfd, else ``/dev/shm``) and how another process maps it |
| ``worker.py`` | inside a worker: the installed ``decode``, ``sample_rng``, slab writes, its lifeline |
| ``pool.py`` | the worker processes: forkserver start in the background, crash recovery, bounded shutdown |
| ``zygote.py`` | the fork server forked from the trainer before any loader thread; ends with the trainer |
| ``forking.py`` | how helpers start: never importing the main module |
| ``slots.py`` | decode slots granted in epoch order (no head-of-line blocking) |
| ``image.py`` | ``ImageDecoder``: Pillow decode with JPEG draft mode, any mode to RGB, crops |

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

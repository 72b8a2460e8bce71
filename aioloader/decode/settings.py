"""The decoding part's settings: what decodes a file's bytes, in how many processes, where,
and how often the pool of them is rebuilt after crashes.

:class:`Decoding` holds ``Loader``'s ``decode``, ``num_workers``, ``decode_on`` and
``max_worker_restarts``: their defaults are here (``Loader``'s signature reads them), and
each is checked when a ``Decoding`` is made, the error naming the argument and showing the
value. What needs another part too (a device decode's device, Ray with a loader process) is
checked where the parts meet (:meth:`aioloader.config.LoaderConfig.create`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aioloader.base.checks import callable_or_none, non_negative_int, positive_int
from aioloader.decode.image import ImageDecoder

__all__ = ["DecodeOn", "Decoding"]

#: ``decode_on``: where the decode runs.
DecodeOn = Literal["local", "ray"]


class _DefaultDecode:
    """The default ``decode``: an ``ImageDecoder(224)``, as its repr shows (help, API pages),
    made anew for each loader."""

    def __repr__(self) -> str:
        return "ImageDecoder(224)"


_DEFAULT: Any = _DefaultDecode()


@dataclass(frozen=True)
class Decoding:
    """How samples are decoded (see ``Loader`` for each setting).

    Invariant: once made, ``decode`` is a callable or None (the default stands for a new
    ``ImageDecoder(224)``)."""

    decode: Callable[[bytes], Any] | None = _DEFAULT
    num_workers: int | Literal["auto"] | None = None
    decode_on: DecodeOn = "local"
    max_worker_restarts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.decode, _DefaultDecode):
            object.__setattr__(self, "decode", ImageDecoder(224))
        callable_or_none("decode", self.decode, "bytes -> sample")
        if self.num_workers is not None and self.num_workers != "auto":
            if isinstance(self.num_workers, str):
                raise ValueError(
                    f"num_workers={self.num_workers!r} must be a positive integer, 'auto' or None"
                )
            positive_int("num_workers", self.num_workers)
        non_negative_int("max_worker_restarts", self.max_worker_restarts)
        if self.decode_on not in ("local", "ray") or not isinstance(self.decode_on, str):
            raise ValueError(f"decode_on={self.decode_on!r} must be 'local' or 'ray'")
        if self.on_ray:
            self._check_ray()

    @property
    def on_ray(self) -> bool:
        return self.decode_on == "ray"

    @property
    def workers_auto(self) -> bool:
        """``num_workers="auto"``: the tuner picks how many of the workers decode at once."""
        return self.num_workers == "auto"

    def _check_ray(self) -> None:
        """A ``ValueError`` naming what cannot go with ``decode_on="ray"``, an ``ImportError``
        naming the extra without Ray installed."""
        if self.decode is None:
            raise ValueError("decode_on='ray' needs a decode function (decode=None: nothing to decode)")
        if self.num_workers == "auto":
            raise ValueError(
                "num_workers='auto' cannot go with decode_on='ray': give the Ray tasks to run at once, "
                "or None for as many as the cluster has CPUs"
            )
        try:
            found = importlib.util.find_spec("ray") is not None
        except (ImportError, ValueError):  # a finder that refuses it, or a module without a spec
            found = False
        if not found:
            raise ImportError("decode_on='ray' needs Ray: pip install 'aioloader[ray]'")

"""The settings of the parts that make and deliver batches, and of the failure policy.

:class:`Delivery` holds ``Loader``'s ``collate``, ``prefetch``, ``ordered``, ``zero_copy``,
``device``, ``pin_memory``, ``loader_process`` and ``progress``: how a batch is made from
its samples, where it runs and where it goes. :class:`Failures` holds ``on_error``,
``max_failures`` and ``sample_timeout``: what a failed or hung sample does. Their defaults
are here (``Loader``'s signature reads them), and each is checked when the object is made,
the error naming the argument and showing the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from aioloader.base.checks import callable_or_none, flag, positive_int

__all__ = ["Delivery", "Failures", "LoaderProcess", "OnError", "Progress", "resolve_device"]

#: ``on_error``: what a failed sample does.
OnError = Literal["raise", "skip"]
#: ``loader_process``: ``"auto"`` (a loader process wherever one can be made), True or False.
LoaderProcess = bool | Literal["auto"]
#: ``progress``: a bar when stderr is a terminal (True), always, or never.
Progress = bool | Literal["always"]


@dataclass(frozen=True)
class Delivery:
    """How batches are made and delivered (see ``Loader`` for each setting).

    Invariant: once made, ``device`` is a ``torch.device`` (``"cuda"`` keeps no index until
    the loader starts: :func:`aioloader.run.start.settle_device`) and ``pin_memory`` a bool,
    True only for a CUDA device (page-locked memory means nothing for another copy)."""

    collate: Callable[[list[Any]], Any] | None = None
    prefetch: int = 2
    ordered: bool = True
    zero_copy: bool = True
    device: str | torch.device | None = None
    pin_memory: bool | None = None
    loader_process: LoaderProcess = "auto"
    progress: Progress = False

    def __post_init__(self) -> None:
        callable_or_none("collate", self.collate, "list of samples -> batch", say_none=False)
        positive_int("prefetch", self.prefetch)
        flag("ordered", self.ordered)
        flag("zero_copy", self.zero_copy)
        if not (isinstance(self.loader_process, bool) or self.loader_process == "auto"):
            raise ValueError(f"loader_process={self.loader_process!r} must be 'auto', True or False")
        if self.progress not in (True, False, "always") or not isinstance(self.progress, (bool, str)):
            raise ValueError(f"progress={self.progress!r} must be True, False or 'always'")
        if not (self.device is None or isinstance(self.device, (str, torch.device))):
            raise TypeError(f"device={self.device!r} must be None, a string or a torch.device")
        if self.pin_memory is not None and not isinstance(self.pin_memory, bool):
            raise TypeError(f"pin_memory={self.pin_memory!r} must be True, False or None")
        device = resolve_device(self.device)
        object.__setattr__(self, "device", device)  # frozen: settled once, here
        object.__setattr__(self, "pin_memory", device.type == "cuda" and self.pin_memory is not False)

    @property
    def target(self) -> torch.device:
        """``device`` as a ``torch.device`` (settled when made)."""
        assert isinstance(self.device, torch.device)
        return self.device


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches are delivered on; refuses CUDA when this machine has none, and an
    index it has not. ``"cuda"`` keeps no index: the loader settles it when it starts, as this
    rank's GPU (:func:`aioloader.run.start.settle_device`), not as the current device now."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a valid torch device") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, but torch.cuda.is_available() is False")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    if dev.type != "cpu":
        raise ValueError(f"device={device!r}: only 'cpu' and 'cuda[:N]' are supported")
    return dev


@dataclass(frozen=True)
class Failures:
    """What a failed sample does (see ``Loader`` for each setting, and
    :mod:`aioloader.engine.failures` for the policy that applies them)."""

    on_error: OnError = "raise"
    max_failures: int | float | None = None
    sample_timeout: float | None = None

    def __post_init__(self) -> None:
        on_error, max_failures = self.on_error, self.max_failures
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
        if max_failures is not None:
            if on_error != "skip":
                raise ValueError(f"max_failures={max_failures!r} needs on_error='skip'")
            if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)):
                raise TypeError(f"max_failures={max_failures!r} must be an int count or a float fraction")
            if isinstance(max_failures, int) and max_failures < 0:
                raise ValueError(f"max_failures={max_failures!r} must be >= 0")
            if isinstance(max_failures, float) and not 0.0 <= max_failures <= 1.0:
                raise ValueError(f"max_failures={max_failures!r} as a fraction must be in [0, 1]")
        timeout = self.sample_timeout
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"sample_timeout={timeout!r} must be a positive number of seconds or None")
            object.__setattr__(self, "sample_timeout", float(timeout))

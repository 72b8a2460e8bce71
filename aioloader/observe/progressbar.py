"""The per-epoch progress bar of ``Loader(progress=...)``: batches done, with samples/s, MB/s
and the share of time the trainer waited for data, on stderr.

It is drawn by tqdm: pure Python with no dependencies of its own, already in most training
environments, and it redraws at most every ``mininterval`` seconds, so an update costs a
counter and a clock read (rich would bring pygments and a refresh thread). ``progress=True``
draws only when stderr is a terminal (a job's log file gets no bar); ``"always"`` draws
anyway.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, cast

from aioloader.observe.stats import Counters

__all__ = ["EpochBar", "ProgressMode", "make_bar", "terminal_bar"]

ProgressMode = bool | Literal["always"]
T = TypeVar("T")
#: Seconds between updates of the figures after the bar (tqdm redraws as often).
REFRESH = 0.5


class EpochBar:
    """One epoch's bar; :meth:`close` is idempotent and safe from a finalizer."""

    def __init__(self, epoch: int, total: int, counters: Counters, done: int = 0, file: Any = None) -> None:
        self._counters = counters
        self._bar = _quiet_tqdm()(
            total=total,
            desc=f"epoch {epoch}",
            unit="batch",
            initial=done,  # a resumed epoch starts where it left off
            file=file if file is not None else sys.stderr,
            mininterval=REFRESH,
            dynamic_ncols=True,
            leave=True,
        )
        self._t0 = time.perf_counter()
        self._bytes0 = counters.bytes_read
        self._next = self._t0 + REFRESH
        self._closed = False

    def update(self, batches: int = 1) -> None:
        """``batches`` more of the plan done (the counters already know what was delivered)."""
        self._bar.update(batches)
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + REFRESH
            self._bar.set_postfix_str(self.figures(now), refresh=False)

    def figures(self, now: float | None = None) -> str:
        """``"812 samples/s, 79.3 MB/s, waited 4%"`` since the epoch began."""
        c = self._counters
        elapsed = max(1e-9, (now if now is not None else time.perf_counter()) - self._t0)
        return (
            f"{c.epoch_samples / elapsed:.0f} samples/s, "
            f"{(c.bytes_read - self._bytes0) / elapsed / 1e6:.1f} MB/s, "
            f"waited {c.epoch_wait / elapsed:.0%}"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._bar.set_postfix_str(self.figures(), refresh=False)
        self._bar.close()


def _quiet_tqdm() -> Any:
    """tqdm without its monitor thread (it would outlive ``close()``)."""
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[type-arg]
        monitor_interval = 0

    return Bar


def terminal_bar(items: Iterable[T], mode: ProgressMode, **kw: Any) -> Iterable[T]:
    """``items``, with a bar on stderr as ``mode`` says (see :func:`make_bar`)."""
    if not _drawn(mode):
        return items
    return cast("Iterable[T]", _quiet_tqdm()(items, file=sys.stderr, mininterval=REFRESH, **kw))


def make_bar(
    mode: ProgressMode, epoch: int, total: int, counters: Counters, done: int = 0
) -> EpochBar | None:
    """The bar for this epoch (``done`` of its ``total`` batches already received, on a
    resume), or None: ``mode`` off, or ``True`` with stderr not a terminal."""
    return EpochBar(epoch, total, counters, done) if _drawn(mode) else None


def _drawn(mode: ProgressMode) -> bool:
    return mode == "always" or (mode is True and _is_terminal(sys.stderr))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

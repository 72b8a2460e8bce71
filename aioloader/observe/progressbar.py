"""The per-epoch progress bar of ``Loader(progress=...)``: batches done, with samples/s, MB/s
and the share of time the trainer waited for data, on stderr; with ``Loader(cache=...)``,
also the epoch's share of samples served from the cache and the bytes it holds.

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

__all__ = ["EpochBar", "ProgressMode", "bar_drawn", "make_bar", "size_text", "terminal_bar"]

ProgressMode = bool | Literal["always"]
T = TypeVar("T")
#: Seconds between updates of the figures after the bar (tqdm redraws as often).
REFRESH = 0.5


class EpochBar:
    """One epoch's bar; :meth:`close` is idempotent and safe from a finalizer."""

    def __init__(self, epoch: int, total: int, counters: Counters, done: int = 0, file: Any = None) -> None:
        self._counters = counters
        self._epoch = epoch
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
        """``"812 samples/s, 79.3 MB/s, waited 4%"`` since the epoch began; with a cache,
        then ``", cache 100% 412MB"``: this epoch's share of samples served from it (left
        out until the cache has counted one of this epoch) and the bytes it holds."""
        c = self._counters
        elapsed = max(1e-9, (now if now is not None else time.perf_counter()) - self._t0)
        text = (
            f"{c.epoch_samples / elapsed:.0f} samples/s, "
            f"{(c.bytes_read - self._bytes0) / elapsed / 1e6:.1f} MB/s, "
            f"waited {c.epoch_wait / elapsed:.0%}"
        )
        cache = c.cache
        if cache is None:
            return text
        share = f"{cache.hit_rate:.0%} " if cache.epoch == self._epoch else ""
        return f"{text}, cache {share}{size_text(cache.bytes_held)}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._bar.set_postfix_str(self.figures(), refresh=False)
        self._bar.close()


def size_text(n: int) -> str:
    """Bytes, short and decimal as the MB/s beside them: ``"412MB"``, ``"1.2GB"``, ``"35kB"``,
    ``"481B"``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f}MB"
    return f"{n / 1e3:.0f}kB" if n >= 1e3 else f"{n}B"


def _quiet_tqdm() -> Any:
    """tqdm without its monitor thread (it would outlive ``close()``)."""
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[type-arg]
        monitor_interval = 0

    return Bar


def terminal_bar(items: Iterable[T], mode: ProgressMode, **kw: Any) -> Iterable[T]:
    """``items``, with a bar on stderr as ``mode`` says (see :func:`make_bar`)."""
    if not bar_drawn(mode):
        return items
    return cast("Iterable[T]", _quiet_tqdm()(items, file=sys.stderr, mininterval=REFRESH, **kw))


def make_bar(
    mode: ProgressMode, epoch: int, total: int, counters: Counters, done: int = 0
) -> EpochBar | None:
    """The bar for this epoch (``done`` of its ``total`` batches already received, on a
    resume), or None: ``mode`` off, or ``True`` with stderr not a terminal."""
    return EpochBar(epoch, total, counters, done) if bar_drawn(mode) else None


def bar_drawn(mode: ProgressMode) -> bool:
    """Whether a bar is drawn under ``mode``: ``"always"``, or ``True`` with stderr a terminal."""
    return mode == "always" or (mode is True and _is_terminal(sys.stderr))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

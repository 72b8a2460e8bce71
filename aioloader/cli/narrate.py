"""How the demo tells what it is doing on any output, not only a terminal.

On a terminal, tqdm bars on stderr show each long phase. Elsewhere (a pipe, a CI log, ``|
tee``, a notebook's captured output) no bar is drawn, and a demo silent for minutes looks
hung: there, :class:`Ticker` says ``desc (n/N)`` as a flushed line every few seconds. Every
line is flushed as it is said: a pipe's stdout is block-buffered, and would otherwise show
the demo's lines only when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aioloader.observe.progressbar import bar_drawn

__all__ = ["EVERY", "Ticker", "say"]

#: Seconds between two progress lines of one phase.
EVERY = 5.0


def say(text: str) -> None:
    """Print one line of the demo, flushed at once."""
    print(text, flush=True)


class Ticker:
    """Called with the count done so far; says ``desc (done/total)`` when ``every`` seconds
    passed since the phase began or since its last line. Silent where a bar is drawn
    (``quiet``: stderr a terminal), and ``clock`` is the tests' to drive."""

    def __init__(
        self,
        desc: str,
        total: int,
        out: Callable[[str], None] = say,
        every: float = EVERY,
        quiet: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desc, self.total, self.out, self.every, self.clock = desc, total, out, every, clock
        self.quiet = bar_drawn(True) if quiet is None else quiet
        self.last = clock()

    def __call__(self, done: int) -> None:
        if self.quiet or done >= self.total:  # the phase's own closing line says the end
            return
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self.out(f"  {self.desc} ({done:,}/{self.total:,})")

"""The failure policy: what a failed sample does to the epoch (``on_error``,
``max_failures``), in one object per loader.

Under ``on_error="raise"`` a :class:`~aioloader.SampleError` goes to the trainer in its
batch's place. Under ``"skip"`` the sample is left out, counted in ``loader.stats``, and
logged once per file per loader on the ``aioloader`` logger at WARNING. ``max_failures``
gives up with a :class:`~aioloader.LoaderError`: an int ``n`` at the failure after ``n``;
a float ``f`` when failures / samples attempted exceeds ``f``, judged over the loader's life
(counts restored by ``load_state_dict`` included) and only once at least
:data:`MIN_ATTEMPTED` samples were attempted, so one early failure does not end a run.
"""

from __future__ import annotations

import logging

from .errors import LoaderError, SampleError
from .stats import Counters

__all__ = ["MIN_ATTEMPTED", "FailurePolicy", "over_limit"]

logger = logging.getLogger("aioloader")

#: Samples attempted before a fractional ``max_failures`` is judged.
MIN_ATTEMPTED = 100


def over_limit(limit: int | float | None, failures: int, attempted: int) -> bool:
    """Whether ``failures`` of ``attempted`` samples exceed ``max_failures=limit`` (pure)."""
    if limit is None:
        return False
    if isinstance(limit, int):
        return failures > limit
    return attempted >= MIN_ATTEMPTED and failures > limit * attempted


class FailurePolicy:
    """Decides, for each failed sample, whether the epoch stops; keeps the counts in
    ``counters`` (which ``state_dict`` saves and ``load_state_dict`` restores)."""

    def __init__(self, on_error: str, max_failures: int | float | None, counters: Counters) -> None:
        self.on_error = on_error
        self.max_failures = max_failures
        self._counters = counters
        self._warned: set[str] = set()

    def attempted(self, n: int = 1) -> None:
        """``n`` more samples were attempted (read, then decoded)."""
        self._counters.attempt(n)

    def failed(self, err: SampleError) -> None:
        """Raise ``err`` (``"raise"``), or count it and return (``"skip"``); raise a
        :class:`LoaderError` when this failure is one too many."""
        if self.on_error == "raise":
            raise err
        # A skipped error lives on in log handlers: its traceback's frames would keep the
        # batch's slab (and whatever else they hold) alive with it.
        err.__traceback__ = None
        self._counters.failed(type(err).__name__, err.path)
        if err.path not in self._warned:
            self._warned.add(err.path)
            logger.warning("skipped %s", err)
        failures, attempted = self._counters.failure_counts()
        if over_limit(self.max_failures, failures, attempted):
            raise LoaderError(
                f"too many failed samples: {failures} of {attempted} attempted "
                f"(max_failures={self.max_failures!r}); last: {err}"
            ) from err

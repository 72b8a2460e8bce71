"""The failure policy: what a failed sample does to the epoch (``on_error``,
``max_failures``), in one object per loader (and one more on the trainer's side for the
device decode's failures, when a loader process runs the pipeline:
:mod:`aioloader.decode.ondevice.bridgeside`).

Under ``on_error="raise"`` a :class:`~aioloader.SampleError` goes to the trainer in its
batch's place, its last line (:data:`SKIP_HINT`) saying that ``"skip"`` exists. Under
``"skip"`` the sample is left out, counted in ``loader.stats``, and logged once per file per
loader on the ``aioloader`` logger: one WARNING line (the path and the cause), and a worker's
traceback, if any, at DEBUG. ``max_failures``
gives up with a :class:`~aioloader.LoaderError`:

- an int ``n``: at the failure after ``n``;
- a float ``f``: when failures / samples attempted exceeds ``f``, judged over the loader's
  life (counts restored by ``load_state_dict`` included, both failures and samples
  attempted) and only once at least :data:`MIN_ATTEMPTED` samples were attempted, so one
  early failure does not end a run. It is judged at each failure after that, when the count
  of samples attempted reaches :data:`MIN_ATTEMPTED`, and at the end of each epoch: failures
  that all came early, with none after them, are still judged.

The decisions are pure functions (:func:`over_limit`, :func:`reaches_minimum`,
:func:`judged_at_epoch_end`); :class:`FailurePolicy` applies them to the loader's counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aioloader.errors import LoaderError, SampleError
from aioloader.observe.stats import Counters

__all__ = [
    "MIN_ATTEMPTED",
    "SKIP_HINT",
    "FailurePolicy",
    "give_up_message",
    "judged_at_epoch_end",
    "over_limit",
    "reaches_minimum",
]

logger = logging.getLogger("aioloader")

#: Samples attempted before a fractional ``max_failures`` is judged.
MIN_ATTEMPTED = 100

#: The last line of a sample's error that reaches the trainer: most first runs meet a few
#: broken files, and the way past them is not in the traceback otherwise.
SKIP_HINT = (
    'To leave samples that fail out of their batches instead, pass on_error="skip" to the Loader '
    "(each file is logged once as a WARNING and counted in loader.stats; "
    "max_failures sets how many to accept)."
)


def over_limit(limit: int | float | None, failures: int, attempted: int) -> bool:
    """Whether ``failures`` of ``attempted`` samples exceed ``max_failures=limit`` (pure)."""
    if limit is None:
        return False
    if isinstance(limit, int):
        return failures > limit
    return attempted >= MIN_ATTEMPTED and failures > limit * attempted


def reaches_minimum(limit: int | float | None, before: int, after: int) -> bool:
    """Whether samples attempted going from ``before`` to ``after`` make a fractional
    ``limit`` due between failures: the count reached :data:`MIN_ATTEMPTED` (pure). A count
    (int) is only ever judged at a failure."""
    return isinstance(limit, float) and before < MIN_ATTEMPTED <= after


def judged_at_epoch_end(limit: int | float | None) -> bool:
    """Whether ``limit`` is judged at the end of an epoch (pure): a fraction is, so failures
    that all came early are still judged; a count is only ever judged at a failure."""
    return isinstance(limit, float)


def give_up_message(limit: int | float, failures: int, attempted: int, last: SampleError | None) -> str:
    """The :class:`LoaderError`'s message (pure); ``last``: the latest failure this loader saw,
    if any (counts restored by ``load_state_dict`` come without one)."""
    text = f"too many failed samples: {failures} of {attempted} attempted (max_failures={limit!r})"
    return f"{text}; last: {last.summary}" if last is not None else text


class FailurePolicy:
    """Decides, for each failed sample, whether the epoch stops; keeps the counts in
    ``counters`` (which ``state_dict`` saves and ``load_state_dict`` restores)."""

    def __init__(
        self,
        on_error: str,
        max_failures: int | float | None,
        counters: Counters,
        member: Callable[[int], str | None] | None = None,
    ) -> None:
        self.on_error = on_error
        #: The tar member a sample index is (``FileDataset.member``), named in its errors.
        self._member = member
        self.max_failures = max_failures
        self._counters = counters
        self._warned: set[str] = set()
        # The latest failure, the cause of a LoaderError judged between failures. Kept as
        # safely as a logged one: its traceback is cleared (see failed), and its cause (a
        # read's OSError, a worker's exception) comes without one.
        self._last: SampleError | None = None

    def attempted(self, n: int = 1) -> None:
        """``n`` more samples were attempted (read, then decoded); raise a
        :class:`LoaderError` when this makes a fractional ``max_failures`` due and over."""
        self._counters.attempt(n)
        failures, attempted = self._counters.failure_counts()
        if reaches_minimum(self.max_failures, attempted - n, attempted):
            self._judge(failures, attempted)

    def epoch_ended(self) -> None:
        """The epoch's last batch is in the ready queue: raise a :class:`LoaderError` when a
        fractional ``max_failures`` is over (it then reaches the trainer as the epoch's last
        item, after all its batches)."""
        if judged_at_epoch_end(self.max_failures):
            self._judge(*self._counters.failure_counts())

    def failed(self, err: SampleError) -> None:
        """Raise ``err`` (``"raise"``), or count it and return (``"skip"``); raise a
        :class:`LoaderError` when this failure is one too many."""
        if self._member is not None and (name := self._member(err.index)) is not None:
            err.name_member(name)
        if self.on_error == "raise":
            err.hint = SKIP_HINT
            raise err
        # A skipped error lives on in log handlers: its traceback's frames would keep the
        # batch's slab (and whatever else they hold) alive with it.
        err.__traceback__ = None
        self._counters.failed(type(err).__name__, err.path)
        if err.path not in self._warned:
            self._warned.add(err.path)
            logger.warning("skipped %s", err.summary)
            # The traceback helps debug a decode, but one per bad file would bury the log.
            details = str(err)[len(err.summary) :].strip()
            if details:
                logger.debug("skipped %s: %s", err.path, details)
        self._last = err
        self._judge(*self._counters.failure_counts())

    def _judge(self, failures: int, attempted: int) -> None:
        if self.max_failures is not None and over_limit(self.max_failures, failures, attempted):
            raise LoaderError(
                give_up_message(self.max_failures, failures, attempted, self._last)
            ) from self._last

"""Which epoch a loader's next iteration runs, and where in it: the bookkeeping behind
``set_epoch``, ``state_dict`` and ``load_state_dict``. Pure: no I/O, no event loop.

It never makes an epoch's order: the trainer needs only how many batches an epoch has
(:func:`~aioloader.plan.resume.plan_len`); the plan is made once, by the runtime that
produces the batches.

Epochs count up by themselves: an iteration that follows another without ``set_epoch`` runs
the next epoch. ``set_epoch(e)`` (or a loaded state) fixes the next one instead. A loaded
state applies to its own epoch only, and only once: the iteration after it starts afresh.
"""

from __future__ import annotations

from aioloader.plan.resume import Progress, ResumePoint, plan_len
from aioloader.plan.settings import Sampling

__all__ = ["Epochs"]


class Epochs:
    """The epoch of a loader over ``dataset_len`` samples with ``sampling``: the current (or
    next) one, the resume point waiting for it, and the progress of the last iteration."""

    def __init__(self, sampling: Sampling, dataset_len: int) -> None:
        self._sampling = sampling
        self._len = dataset_len
        #: The epoch of the current (or next) iteration.
        self.epoch = 0
        self._chosen = True  # the first iteration runs epoch 0 unless set_epoch says otherwise
        self._resume: ResumePoint | None = None  # from a loaded state, until its epoch starts
        self._progress: Progress | None = None  # of the current (or last) iteration

    def set(self, epoch: int) -> None:
        """The next iteration runs ``epoch`` (a ``ValueError`` unless a non-negative int). A
        loaded state for that epoch keeps its position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be a non-negative integer")
        self.epoch = epoch
        self._chosen = True

    def begin(self) -> tuple[Progress, ResumePoint | None]:
        """Start an iteration: the progress the trainer's receipts are counted in (its
        ``epoch``, its ``total`` of batches), and the resume point the epoch starts from (None
        for a whole epoch). No plan is made here: the runtime makes it from the two
        (:func:`~aioloader.plan.resume.plan_for`), where the batches are produced."""
        if not self._chosen:
            self.epoch += 1
        self._chosen = False
        point = self._resume if self._resume is not None and self._resume.epoch == self.epoch else None
        self._resume = None
        self._progress = Progress(self.epoch, plan_len(self._sampling, self._len, self.epoch, point), point)
        return self._progress, point

    def progress(self, batches_per_epoch: int) -> Progress:
        """Where a state dict taken now says the loader is: the current iteration's progress,
        or the start of the epoch chosen for the next one."""
        progress = self._progress
        if progress is None or (self._chosen and progress.epoch != self.epoch):
            progress = Progress(self.epoch, batches_per_epoch)
        return progress

    def resume(self, point: ResumePoint) -> None:
        """The next iteration continues ``point``'s epoch where it stopped."""
        self._resume = point
        self.epoch, self._chosen = point.epoch, True
        total = plan_len(self._sampling, self._len, point.epoch, point)
        self._progress = Progress(point.epoch, total, point)

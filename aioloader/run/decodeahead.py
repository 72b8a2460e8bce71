"""The ``aioloader-decode`` thread: the device decode's first half, one batch ahead of the bridge.

nvImageCodec's batched decode blocks its calling thread for its host side (parsing, and the
Huffman decoding the hardware engine does not take) before its GPU side runs on a stream. On
the bridging thread, that host time would be added to every batch's copy. So, with a device
decode, the bridge serves its run through :class:`DecodeAhead`: a thread of its own pulls the
run's items in order, has each encoded batch's decode started on its own CUDA stream
(:meth:`~aioloader.decode.ondevice.bridgeside.DeviceDecode.begin`: the images decoded into
a padded buffer PyTorch allocated, an event recorded after them) and passes the items on in order. While the
bridge resizes and copies batch ``k`` and the trainer trains on ``k - 1``, this thread decodes
``k + 1``.

Bounds: at most ``depth`` items wait between the two threads, and one more is being
decoded: ``depth + 1`` batches' padded buffers on the device beyond the bridge's own (each
``images x Hmax x Wmax x 3`` bytes, the batch's largest image's size).

Lifecycle: one thread per run, started with it; it ends after the run's last item (its end,
its failure), or when the run is cancelled (:meth:`DecodeAhead.cancel`, from any thread),
which also wakes both threads. The bridge closes it (:meth:`DecodeAhead.close`) before
serving the next run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from aioloader.base.items import End, Failure, Item
from aioloader.run.handoff import Closed, Handoff

__all__ = ["DecodeAhead"]


class _Run(Protocol):
    handoff: Handoff[Item]

    @property
    def cancelled(self) -> bool: ...  # read only here: a Source's is a property

    def next_ready(self) -> Item | None: ...

    def cancel(self) -> None: ...


class DecodeAhead:
    """``run`` (a :class:`~aioloader.run.bridge.Source`) with each item passed through
    ``begin`` on the ``aioloader-decode`` thread, at most ``depth`` ahead of
    :meth:`next_ready`; ``bind`` is called first on that thread (its CUDA device)."""

    def __init__(
        self, run: _Run, begin: Callable[[Item], Item], bind: Callable[[], None], depth: int = 1
    ) -> None:
        self.run = run
        self.handoff = run.handoff  # the trainer's hand-off: the bridge's to fill
        self._begin = begin
        self._bind = bind
        self._ahead: Handoff[Item] = Handoff(depth)
        self._thread = threading.Thread(target=self._main, name="aioloader-decode", daemon=True)
        self._thread.start()

    @property
    def cancelled(self) -> bool:
        return self.run.cancelled

    def next_ready(self) -> Item | None:
        """The run's next item, its decode started; None once the run is over or cancelled."""
        try:
            return self._ahead.get()
        except Closed:
            return None

    def cancel(self) -> None:
        self.run.cancel()
        self._ahead.close()

    def close(self, timeout: float | None = None) -> None:
        """Stop and join the thread: after the run's end it has stopped by itself; before
        (the trainer went away), the run is cancelled to wake it."""
        if self._thread.is_alive() and not self.run.cancelled:
            self.cancel()
        self._ahead.close()
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self._bind()
            while (item := self.run.next_ready()) is not None:
                if not self._ahead.put(self._begin(item)):
                    return  # cancelled
                if isinstance(item, (End, Failure)):
                    return
        except BaseException as exc:  # noqa: BLE001 - the run's failure, in its place
            self._ahead.put(Failure(exc))
        finally:
            self._ahead.close()  # what is queued can still be taken, then next_ready gives None

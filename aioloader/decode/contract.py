"""The decode stage's contract: what the engine and the tuner ask of a decode stage, whoever
decodes (this machine's worker processes, :class:`~aioloader.decode.stage.DecodeStage`; Ray
tasks, :class:`~aioloader.cluster.stage.RayDecodeStage`; a GPU stage next).

A stage is chosen once, where the loader is built
(:func:`aioloader.engine.decoding.decode_stage`); the engine then holds a
:class:`DecodeStageLike` (or nothing, with ``decode=None``) and never asks which stage it
is, nor which class the user's decoder is: what differs between stages is said here, as
numbers and flags the stage declares. Pure: no I/O, no loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from aioloader.decode.chunk import Shrink
from aioloader.errors import SampleError
from aioloader.memory.results import RowResult, Shrunk

if TYPE_CHECKING:
    from aioloader.memory.slabs import Slab

__all__ = ["ChunkItem", "DecodeRequest", "DecodeStageLike", "Outcome", "Shrink", "declares_hot_start"]

#: What became of one sample: its result (with the bytes the sample cache keeps, when asked:
#: :class:`~aioloader.memory.results.Shrunk`), or the error that ends it.
Outcome = RowResult | Shrunk | SampleError

#: One sample of a chunk: ``(row in its batch, dataset index, source)``. The source is the
#: file's bytes, its ``(offset, size)`` in the batch's input arena, or, for a stage that
#: reads URLs itself (:attr:`DecodeStageLike.reads_urls`), the URL as a string.
ChunkItem = tuple[int, int, Any]

#: ``(max_side, quality, rows)``: the rows of a chunk whose file the sample cache keeps
#: downscaled (longest side at most ``max_side`` pixels, JPEG ``quality`` 1-100), a non-empty
#: subset of the chunk's rows (:func:`aioloader.engine.caching.shrink_for`).


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """One chunk of a batch to decode: what :meth:`DecodeStageLike.run` is given. Made once
    per chunk by the engine; a stage that hands part of it on makes another
    (``dataclasses.replace``). The slabs it names are the batch's, held by the engine until
    the run returns."""

    #: The epoch, from 0: with the loader's seed and a sample's dataset index, what its
    #: random draws are seeded by (:func:`aioloader.sample_rng`).
    epoch: int
    #: The batch's number in the epoch, from 0: with the chunk's first row, the key its
    #: decode slots are granted in order by, ``(k, first row)``.
    k: int
    #: The samples, each ``(row in the batch, dataset index, source)``: in row order, rows
    #: distinct, at least one.
    items: list[ChunkItem]
    #: The batch's rows slab the results are written into (None: none, results pickled).
    slab: Slab | None = None
    #: ``(offset, bytes)`` in ``slab``: this chunk's share of its output area, where
    #: results go while the slab has no row layout (None: no share).
    out: tuple[int, int] | None = None
    #: The batch's input arena, where the ``(offset, size)`` sources lie (None: the
    #: sources are the bytes, or URLs).
    inputs: Slab | None = None
    #: The sample cache's part: the rows it keeps downscaled (None: none; only for a stage
    #: of this machine's CPU workers, the loader's arguments refuse ``max_side`` elsewhere).
    shrink: Shrink | None = None
    #: Where :attr:`slab` is not given yet: takes the batch's rows slab and this chunk's
    #: :attr:`out` share, called through :meth:`with_rows` once the chunk's decode slot is
    #: granted. A batch waiting for the workers then holds no rows slab: in steady state one
    #: fewer slab is resident (see :mod:`aioloader.engine.sizing`).
    take_rows: Callable[[], tuple[Slab | None, tuple[int, int] | None]] | None = None

    def with_rows(self) -> DecodeRequest:
        """This request with its rows slab and output share taken (:attr:`take_rows`), to
        call once the chunk is about to decode, at most once per chunk; itself when they
        were given already."""
        if self.take_rows is None:
            return self
        slab, out = self.take_rows()
        return dataclasses.replace(self, slab=slab, out=out, take_rows=None)


@runtime_checkable
class DecodeStageLike(Protocol):
    """A decode stage: one chunk of a batch in, one :data:`Outcome` per sample out.

    Invariants every stage keeps: :meth:`run` returns exactly one outcome per item, in the
    items' order; a sample's failure is its outcome, never an exception (what :meth:`run`
    raises ends the whole loader: a :class:`~aioloader.LoaderError`, or a cancellation);
    chunks ask for the stage's decode slots keyed ``(batch, first row)``, and the stage grants
    them in that (epoch) order, never by arrival. Loop-bound: every method runs on the
    loader's event loop.
    """

    #: Samples per decode task, fixed for the loader's life (1 <= chunk <= batch_size): the
    #: engine cuts each batch into chunks of this many rows (after the first batch's probes).
    chunk: int
    #: Samples of an epoch's first batch that decode alone, one per task, while the slabs'
    #: layout is still unknown (the first to finish teaches it; the batch's other chunks then
    #: decode straight into rows). A local pool: its worker count (one probe per worker);
    #: 0 for a stage that writes rows on the loader's side whatever the layout (Ray).
    probes: int
    #: Samples the engine's window of batches must keep in flight, beyond the reader's limit,
    #: for this stage to be busy: its task slots times :attr:`chunk` where its tasks may read
    #: for themselves (Ray: ``2 x tasks`` slots); 0 where the reader's reads feed it (a local
    #: pool).
    samples_in_flight: int
    #: True: the stage reads the dataset's URLs itself (they reach :meth:`run` as strings,
    #: not read by the reader). Never with a custom ``read`` or byte ranges of a file.
    reads_urls: bool
    #: Decoders at work now (processes or tasks); :meth:`set_workers` moves it.
    active: int

    def set_workers(self, active: int) -> None:
        """Let ``active`` decoders work at once (``num_workers="auto"``), clamped to what the
        stage has (at least 1); a stage whose decoders are not tuned ignores it."""

    async def run(self, request: DecodeRequest) -> list[Outcome]:
        """Decode ``request``'s items of its batch into its slab's rows (or, with no layout,
        its output area share; or pickled, without a slab), taken by
        :meth:`DecodeRequest.with_rows` once the chunk's decode slot is granted. The rows in
        ``request.shrink``: their successes come back as
        :class:`~aioloader.memory.results.Shrunk`. One outcome per item, in order."""
        ...


def declares_hot_start(decode: Any) -> bool:
    """Whether ``decode`` declares itself trusted code that may also run on a thread of the
    loader's process while the workers boot (hot start): a class attribute
    ``hot_start = True``, as the built-in :class:`~aioloader.ImageDecoder` (and so every
    subclass of it) has. Anything else, a user's function among them, is never hot."""
    return getattr(decode, "hot_start", False) is True

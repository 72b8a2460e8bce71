"""One batch under construction: the shared memory it holds (:class:`BatchSlabs`) and what
its chunks share while they read and decode (:class:`BatchWork`). Loop-bound, no waiting."""

from __future__ import annotations

from dataclasses import dataclass, field

from aioloader.cache.samples import Fill
from aioloader.memory.results import RowResult
from aioloader.memory.slabs import Slab, SlabPool

__all__ = ["BatchSlabs", "BatchWork", "Fills", "RowsTaker"]

#: A batch's misses, by row: what keeps each once it succeeds (its key, or ``UNKEPT``: see
#: :meth:`aioloader.cache.samples.SampleCache.serve`), and the length read.
Fills = dict[int, tuple[Fill, int]]


class BatchSlabs:
    """The slabs one batch holds while it is built, from ``rows_pool`` and ``inputs_pool``.

    - :attr:`rows`: the rows slab its chunks decode into and it is assembled from. The
      epoch's first batch takes it at once (``take_rows``); a later batch when its first
      chunk is granted its decode slot, past the epoch's opening, so that it gets the
      layout the first batch taught and holds no slab while it waits for the workers
      (:meth:`taker`, :meth:`rows_for_decode`).
    - :attr:`earlier`: rows slabs taken before the layout was learned, that a probe may
      still be decoding into (:meth:`relayout`); given back with the batch, newest first.
    - :attr:`inputs`: the input arena its files are read into, until its samples are
      decoded (:meth:`decoded`).

    Whatever ends the batch, :meth:`release` gives every slab back once; after a failure or
    a cancellation, :meth:`taint` first marks them never to be reused, since a worker or a
    read may still write into them.
    """

    def __init__(self, rows_pool: SlabPool | None, inputs_pool: SlabPool | None, take_rows: bool) -> None:
        self._rows_pool, self._inputs_pool = rows_pool, inputs_pool
        self.rows = rows_pool.acquire() if rows_pool is not None and take_rows else None
        self.earlier: list[Slab] = []
        self.inputs = inputs_pool.acquire() if inputs_pool is not None else None

    def rows_for_decode(self) -> Slab | None:
        """The rows slab a chunk decodes into, taken now if the batch has none yet (None
        where samples cross pickled: no slabs at all)."""
        if self.rows is None and self._rows_pool is not None:
            self.rows = self._rows_pool.acquire()
        return self.rows

    def taker(self, samples: int, per_sample: int) -> RowsTaker:
        """What a chunk of ``samples`` takes once its decode slot is granted: the rows slab
        (:meth:`rows_for_decode`) and its share of the output area, ``per_sample`` bytes a
        sample (0: none)."""
        return RowsTaker(self, samples, per_sample)

    def relayout(self) -> None:
        """A probe taught the layout after :attr:`rows` was taken without one: the chunks
        still to decode get a slab of that layout, and the old one is kept until the batch
        ends (a probe may still decode into it)."""
        old, pool = self.rows, self._rows_pool
        if old is not None and old.layout.sample is None and pool is not None and pool.sample:
            self.rows = pool.acquire()
            self.earlier.insert(0, old)

    def decoded(self) -> None:
        """Every sample is decoded: the file bytes are no longer needed."""
        if self.inputs is not None:
            assert self._inputs_pool is not None
            self._inputs_pool.release(self.inputs)
            self.inputs = None

    def taint(self) -> None:
        """Never reuse any of them: a worker or a read may still write into them."""
        for slab in (self.rows, *self.earlier, self.inputs):
            if slab is not None:
                slab.tainted = True

    def release(self) -> None:
        """Give back every slab still held: the rows slab (unless the batch handed it out),
        the earlier ones, the input arena."""
        held, self.rows, self.earlier = [self.rows, *self.earlier], None, []
        for slab in held:
            if slab is not None:
                assert self._rows_pool is not None
                self._rows_pool.release(slab)
        self.decoded()


class RowsTaker:
    """A chunk's :attr:`~aioloader.decode.contract.DecodeRequest.take_rows`: called by the
    decode stage when the chunk's decode slot is granted, not when the chunk asks for it, so
    that a batch whose reads are done but whose decodes wait behind the batch before it
    holds no rows slab yet (in a decode-bound steady state, one slab fewer in the pool: the
    next batch's is then taken after the trainer gave back the one it held). :attr:`slab`:
    the slab it took (None until called)."""

    def __init__(self, slabs: BatchSlabs, samples: int, per_sample: int) -> None:
        self._slabs, self._samples, self._per_sample = slabs, samples, per_sample
        self.slab: Slab | None = None

    def __call__(self) -> tuple[Slab | None, tuple[int, int] | None]:
        """``(rows slab, (offset, bytes) of the chunk's output area share or None)``."""
        slab = self.slab = self._slabs.rows_for_decode()
        size = self._samples * self._per_sample
        return slab, (slab.out_share(size) if slab is not None and size else None)


@dataclass
class BatchWork:
    """Batch ``k`` of ``epoch`` while its chunks read and decode: its dataset ``indices``,
    whether it is the epoch's ``first``, its slabs, and ``results`` (a row's result, None
    while undecoded or once failed). ``probes``: its first rows, each decoded alone to
    teach the layout (the first batch's only)."""

    epoch: int
    k: int
    indices: list[int]
    first: bool
    slabs: BatchSlabs
    results: list[RowResult | None] = field(init=False)
    probes: int = 0
    #: Rows read from the source, and whether the sample cache keeps them once they succeed.
    fills: Fills = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.indices)

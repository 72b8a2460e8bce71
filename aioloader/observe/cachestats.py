"""The sample cache as ``loader.stats.cache`` reports it (``Loader(cache=...)``): what was
served from it, what was read from the source, what it holds. Counted where the samples are
read (the loader process, or the trainer's own), sent to the trainer with the other counts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheStats"]


@dataclass(frozen=True)
class CacheStats:
    """Counts over the loader's life, with the current epoch's beside them.

    ``hits``: samples whose bytes came from the cache (no read of the source); ``misses``:
    samples read from the source (``loader.stats.bytes_read`` counts their bytes only);
    ``bytes_served``: the bytes the hits gave the decodes; ``stored``: entries this loader
    kept (a disk cache: written, or found written by another rank meanwhile); ``bytes_held`` and
    ``entries``: what the cache holds now (a disk cache: what it held when the loader
    started, plus what this loader added); ``max_bytes``: its bound; ``over_bound``:
    misses not kept because the bound was reached (each time one is read); ``write_errors``:
    misses not kept because their entry could not be written (a disk cache: each write that
    failed, ENOSPC, EACCES, EIO, ...; once the disk said it is full, ENOSPC or EDQUOT, no
    more writes are tried and each miss since counts, each time one is read); ``rejected``:
    entries found cut short or damaged (read again from the source); ``epoch_hits``,
    ``epoch_misses``: this epoch's. A disk cache's writes land behind the batches: ``stored``,
    ``entries`` and ``bytes_held`` count every one that landed once ``close()`` returned."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    bytes_served: int = 0
    bytes_held: int = 0
    entries: int = 0
    max_bytes: int = 0
    over_bound: int = 0
    rejected: int = 0
    epoch: int = 0
    epoch_hits: int = 0
    epoch_misses: int = 0
    write_errors: int = 0  # last: a field added later, the order of the others kept

    @property
    def hit_rate(self) -> float:
        """This epoch's share of samples served from the cache (0..1)."""
        n = self.epoch_hits + self.epoch_misses
        return self.epoch_hits / n if n else 0.0

"""The sampling part's settings: which samples make each batch, in which order, on which rank.

:class:`Sampling` holds ``Loader``'s ``batch_size``, ``shuffle``, ``seed``, ``drop_last``,
``rank``, ``world_size``, ``pad_shards`` and ``locality``: their defaults are here (``Loader``'s signature
reads them), and each is checked when a ``Sampling`` is made, the error naming the argument
and showing the value. The plan (:mod:`aioloader.plan.resume`, :mod:`aioloader.plan.epochs`)
reads nothing else of a loader's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from aioloader.base.checks import flag, non_negative_int, positive_int
from aioloader.plan.locality import Locality

__all__ = ["Sampling", "resolve_rank"]


@dataclass(frozen=True)
class Sampling:
    """How an epoch's samples are ordered, sharded and batched (see ``Loader`` for each).

    Invariant: once made, ``rank`` and ``world_size`` are ints with ``0 <= rank <
    world_size``; None for either was settled from torch.distributed (:func:`resolve_rank`)."""

    batch_size: int = 256
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    pad_shards: bool = True
    locality: Locality | None = None

    def __post_init__(self) -> None:
        positive_int("batch_size", self.batch_size)
        for name in ("shuffle", "drop_last", "pad_shards"):
            flag(name, getattr(self, name))
        non_negative_int("seed", self.seed)
        if self.locality is not None:
            if not isinstance(self.locality, Locality):
                raise TypeError(f"locality={self.locality!r} must be an aioloader.Locality or None")
            if not self.shuffle:
                raise ValueError(
                    f"locality={self.locality!r} needs shuffle=True: without it the order is the "
                    "dataset's, shard after shard already"
                )
        rank, world_size = resolve_rank(self.rank, self.world_size)
        object.__setattr__(self, "rank", rank)  # frozen: settled once, here
        object.__setattr__(self, "world_size", world_size)

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)``, settled."""
        assert self.rank is not None and self.world_size is not None
        return self.rank, self.world_size


def resolve_rank(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's when a process group is
    initialised, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    ws = positive_int("world_size", world_size)
    r = non_negative_int("rank", rank)
    if r >= ws:
        raise ValueError(f"rank={r} must be below world_size={ws}")
    return r, ws

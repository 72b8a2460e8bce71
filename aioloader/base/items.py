"""What travels from the engine through the ready queue and the bridge to the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["END", "Batch", "End", "Failure", "Item"]


@dataclass
class Batch:
    """Batch ``index`` (0-based in its epoch) of ``size`` samples; ``event`` is the CUDA event
    recorded after its device copy (None on the CPU)."""

    index: int
    value: Any
    size: int
    event: Any = None
    #: Plan batches this delivery completes, when rows were regrouped (aioloader.plan.repack);
    #: empty: just ``index``.
    done: tuple[int, ...] = ()


@dataclass(frozen=True)
class Failure:
    """The epoch stopped on ``error``; it is raised to the trainer in its place in order."""

    error: BaseException


class End:
    """The epoch's last batch has been delivered."""

    def __repr__(self) -> str:
        return "END"


END = End()

Item = Batch | Failure | End

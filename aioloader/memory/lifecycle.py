"""The slab lifecycle, written down once: what may happen to a slab, in which order, by whom.

A slab (:class:`~aioloader.memory.slabs.Slab`) is one shared-memory segment that a batch is
built in. Every slab is in exactly one :class:`SlabState`, and moves only along
:data:`MOVES`; :meth:`Slab.advance <aioloader.memory.slabs.Slab.advance>` refuses any other
move (a bug of ours, raised where it happens rather than found as a changed batch later)::

              acquire (begin)              owner() (commit)
    (made) ─────────────────► TAKEN ─────────────────────────► OUT
                  ▲             │  release, untainted (end)     │ last view garbage (end)
                  │             ▼                               ▼
                  └──────────  FREE  ◄──────────────────────────┘
                                │
       tainted release (abort), │ a layout that no longer fits, the bound lowered,
       pool closed, one-shot    ▼ the pool closed
                              CLOSED  (never reused; held views stay valid)

- **TAKEN** (begin: :meth:`SlabPool.acquire <aioloader.memory.slabs.SlabPool.acquire>`). One
  batch under construction holds it; it was reset (empty arenas, a clear status table).
  Reads land in its input arena, decodes write its rows and output area, from any process
  that maps it through its handle. Only its holder may release it or hand it out.
- **OUT** (commit: :meth:`Slab.owner <aioloader.memory.slabs.Slab.owner>`). Its rows were
  handed out as views (tensors of a delivered batch, a trainer's mapping); nothing writes
  it any more. It comes back when the last view is garbage, from whichever thread drops it
  (a ``weakref.finalize`` on the owner array), or when its device copy has completed.
- **FREE** (end: :meth:`SlabPool.release <aioloader.memory.slabs.SlabPool.release>`). In
  the pool's free list, to be taken again as it is, or closed if it no longer fits. One
  left there while :data:`~aioloader.memory.slabs.IDLE_TAKES` others were taken may give
  its pages back (:meth:`Slab.give_back <aioloader.memory.slabs.Slab.give_back>`: it
  stays FREE, reads as zeros, and is whole again once written); only a FREE slab may, and
  only on a take (the loop's), so never one a held batch views or a closing loader let go.
- **CLOSED** (abort, or the end of a one-shot slab). Unreachable for other processes: its
  memfd descriptor closed, its ``/dev/shm`` name unlinked. A slab that something may still
  write into (``tainted``: a read that timed out, a worker still decoding an abandoned
  batch) goes here, never to FREE. Memory a held view maps stays valid until that view dies.

Who may do what: only the event loop's code acquires and hands out; release comes from the
loop or a finalizer on any thread (the pool's lock orders them); close is idempotent. A
slab is FREE or TAKEN by one holder at a time, never two: the pool's free list holds each
at most once and a second release of a free slab is ignored.
"""

from __future__ import annotations

import enum

__all__ = ["MOVES", "SlabMoveError", "SlabState", "check_move"]


class SlabState(enum.Enum):
    TAKEN = "taken"
    OUT = "out"
    FREE = "free"
    CLOSED = "closed"


#: Every move a slab may make (see the module docstring); CLOSED -> CLOSED: close is idempotent.
MOVES: dict[SlabState, frozenset[SlabState]] = {
    SlabState.TAKEN: frozenset({SlabState.OUT, SlabState.FREE, SlabState.CLOSED}),
    SlabState.OUT: frozenset({SlabState.FREE, SlabState.CLOSED}),
    SlabState.FREE: frozenset({SlabState.TAKEN, SlabState.CLOSED}),
    SlabState.CLOSED: frozenset({SlabState.CLOSED}),
}


class SlabMoveError(RuntimeError):
    """A move the lifecycle does not allow: a bug in aioloader, never the user's input."""


def check_move(name: str, now: SlabState, to: SlabState) -> None:
    """Raise :class:`SlabMoveError` unless a slab in state ``now`` may move to ``to``."""
    if to not in MOVES[now]:
        raise SlabMoveError(f"slab {name}: {now.value} -> {to.value} breaks the slab lifecycle")

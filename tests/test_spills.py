"""The loader process's segments for spilled leaves (aioloader/run/spills.py): reused by best
fit once given back, bounded, all closed at close."""

from __future__ import annotations

import os

import pytest

from aioloader.memory.segments import choose_kind
from aioloader.run.spills import SpillPool

pytestmark = pytest.mark.skipif(choose_kind() is None, reason="needs shared memory (memfd or /dev/shm)")


def test_a_segment_given_back_is_reused_by_best_fit_and_the_pool_is_bounded() -> None:
    kind = choose_kind()
    assert kind is not None
    pool = SpillPool(kind, keep=2)
    a, b = pool.take(1 << 20), pool.take(4 << 20)
    assert a.handle.name.startswith(f"aioloader-{os.getpid()}-s") and a.handle.name != b.handle.name
    pool.give(b)
    pool.give(a)
    assert pool.take(1 << 20) is a  # the best fit, not the first free one
    fresh = pool.take(1 << 20)
    assert fresh is not b and not fresh.closed  # 4 MiB is more than twice 1 MiB: a new one
    fresh.close()
    assert pool.take(3 << 20) is b
    c, d, e = pool.take(8), pool.take(8), pool.take(8)
    for s in (c, d, e):
        pool.give(s)
    assert c.closed and not d.closed and not e.closed  # two kept: the oldest went
    pool.close()
    assert d.closed and e.closed
    pool.give(a)  # given back after close: closed at once
    assert a.closed
    b.close()
    pool.close()  # idempotent


def test_segments_kept_for_reuse_go_once_batches_stop_spilling() -> None:
    """Batches seldom spill without a custom collate: once ``keep`` batches in a row spilled
    nothing, the kept segments are closed, and one given back then is too; the next spill
    starts keeping again."""
    kind = choose_kind()
    assert kind is not None
    pool = SpillPool(kind, keep=2)
    a, b = pool.take(1 << 20), pool.take(1 << 20)
    pool.give(a)
    pool.unused()  # one batch without a spill: kept still
    assert not a.closed
    pool.unused()  # two in a row
    assert a.closed
    pool.give(b)  # came back late: not kept
    assert b.closed
    c = pool.take(1 << 20)  # spilling again
    assert not c.closed
    pool.give(c)
    pool.unused()
    assert not c.closed and pool.take(1 << 20) is c  # one quiet batch: kept, and reused
    pool.close()
    c.close()

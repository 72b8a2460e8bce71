"""While a loader is open, the objects that existed when it started are frozen out of the
cyclic garbage collector (a full collection of a heap holding torch stalls every thread of
the process); the last close puts them back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from helpers import decode_number

from aioloader import Loader
from aioloader.safety import gcfreeze


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_hold_and_release_nest() -> None:
    gcfreeze.hold()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gcfreeze.hold()
    gcfreeze.release()
    assert gc.get_freeze_count() == frozen  # another holder is still open
    gcfreeze.release()
    assert gc.get_freeze_count() == 0
    gcfreeze.release()  # one too many: ignored
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_itself_is_left_alone() -> None:
    gc.freeze()
    before = gc.get_freeze_count()
    gcfreeze.hold()
    gcfreeze.release()
    assert gc.get_freeze_count() == before  # not unfrozen by us


def test_open_loaders_freeze_until_the_last_closes(numbered: list[str]) -> None:
    a = Loader(numbered, batch_size=8, decode=decode_number, num_workers=1)
    b = Loader(numbered, batch_size=8, decode=decode_number, num_workers=1)
    assert gc.get_freeze_count() == 0
    with a:
        assert gc.get_freeze_count() > 0
        with b:
            assert len(list(b)) == 5
        assert gc.get_freeze_count() > 0  # a is still open
        assert len(list(a)) == 5
    assert gc.get_freeze_count() == 0


def test_a_loader_that_fails_to_start_releases(numbered: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from aioloader.run import runtime

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot start")

    monkeypatch.setattr(runtime.Runtime, "_start", broken)  # the in-process runtime's
    with pytest.raises(RuntimeError, match="cannot start"):
        Loader(numbered, batch_size=8, decode=decode_number, num_workers=1, loader_process=False).start()
    assert gc.get_freeze_count() == 0

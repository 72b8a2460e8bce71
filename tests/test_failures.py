"""``max_failures`` at run time, as DESIGN.md settles it: an int ``n`` gives up at the failure
after ``n``; a float ``f`` when failures / samples attempted exceeds ``f``, over the loader's
life (counts restored by ``load_state_dict`` included), once 100 samples were attempted.
Giving up is a ``LoaderError``, never a ``SampleError``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from frontends import Driver
from helpers import FailOn, write_numbered_files

from aioloader import Loader, LoaderError, SampleError
from aioloader.failures import MIN_ATTEMPTED, over_limit


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_numbered_files(tmp_path_factory.mktemp("many"), 300)


@pytest.fixture(autouse=True)
def quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aioloader")  # one WARNING per skipped file


def loader(files: list[str], bad: set[int], limit: int | float | None, **kwargs: object) -> Loader:
    return Loader(
        files,
        batch_size=10,
        decode=FailOn(bad),
        on_error="skip",
        max_failures=limit,
        shuffle=False,
        num_workers=2,
        io_concurrency=16,
        **kwargs,  # type: ignore[arg-type]
    )


def test_over_limit_rule() -> None:
    assert not over_limit(None, 10**6, 1)
    assert not over_limit(3, 3, 10) and over_limit(3, 4, 10)
    assert not over_limit(0.1, 99, 99)  # fewer than MIN_ATTEMPTED attempted: not judged yet
    assert over_limit(0.1, 11, MIN_ATTEMPTED) and not over_limit(0.1, 10, MIN_ATTEMPTED)


def test_count_gives_up_at_the_failure_after_it(frontend: Driver, files: list[str]) -> None:
    bad = {5, 50, 150, 250}
    with frontend.opened(loader(files, bad, 3)) as ld:
        with pytest.raises(LoaderError, match=r"too many failed samples: 4 of \d+ attempted") as info:
            frontend.epoch(ld)
        assert not isinstance(info.value, SampleError)
        assert isinstance(info.value.__cause__, SampleError) and "sample 250" in str(info.value.__cause__)
    with frontend.opened(loader(files, bad - {250}, 3)) as ld:
        got = [int(v) for b in frontend.epoch(ld) for v in b.reshape(-1)]
        assert got == [i for i in range(300) if i not in bad - {250}]
        assert ld.stats.failures == 3


def test_fraction_is_judged_over_samples_attempted(frontend: Driver, files: list[str]) -> None:
    early = set(range(10))  # 10 failures in the first 10 samples: 100% of a few, 3% of all
    with frontend.opened(loader(files, early, 0.05)) as ld:
        assert len([v for b in frontend.epoch(ld) for v in b.reshape(-1)]) == 290
        stats = ld.stats
        assert stats.failures == 10 and stats.attempted == 300
    dense = set(range(0, 300, 8))  # 38 of 300: 12.5%, over 10% once judged
    with (
        frontend.opened(loader(files, dense, 0.10)) as ld,
        pytest.raises(LoaderError, match=r"max_failures=0\.1"),
    ):
        frontend.epoch(ld)


def test_fraction_after_resume_counts_the_restored_samples(
    frontend: Driver, files: list[str], tmp_path: Path
) -> None:
    """A state carries failures *and* samples attempted: after a resume, the first new
    failure is judged against the whole life of the run, not against the few samples the
    new loader has read so far."""
    bad = set(range(0, 120, 10)) | {205}  # 12 failures in the first 120, one more later
    with frontend.opened(loader(files, bad, 0.10)) as ld:
        taken = frontend.take(ld, 13)  # 130 samples received: 12 failed so far
        state = ld.state_dict()
    assert sum(len(b) for b in taken) == 130 - 12 == state["samples_done"]
    assert state["stats"]["attempted"] >= 130
    with frontend.opened(loader(files, bad, 0.10)) as resumed:
        resumed.load_state_dict(state)
        rest = [int(v) for b in frontend.epoch(resumed) for v in b.reshape(-1)]
        assert rest == [i for i in range(130, 300) if i != 205]
        stats = resumed.stats
        assert stats.failures == 13 and stats.attempted >= 300


def test_count_after_resume_includes_restored_failures(frontend: Driver, files: list[str]) -> None:
    bad = {1, 2, 3, 200}
    with frontend.opened(loader(files, bad, 3)) as ld:
        frontend.take(ld, 5)
        state = ld.state_dict()
    with frontend.opened(loader(files, bad, 3)) as resumed:
        resumed.load_state_dict(state)
        with pytest.raises(LoaderError, match="too many failed samples: 4 of"):
            frontend.epoch(resumed)

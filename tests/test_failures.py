"""``max_failures`` at run time, as DESIGN.md settles it: an int ``n`` gives up at the failure
after ``n``; a float ``f`` when failures / samples attempted exceeds ``f``, over the loader's
life (counts restored by ``load_state_dict`` included), once 100 samples were attempted,
judged at each failure after that, when the count of samples attempted reaches 100, and at
the end of each epoch. Giving up is a ``LoaderError``, never a ``SampleError``.

The judgement points are pure (first tests, no loop); the loader cases of the judgement
points run through both front-ends (``frontend``) and both runtimes (``loader_process``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from frontends import Driver
from helpers import FailOn, RuntimeWatch, write_numbered_files

from aioloader import Loader, LoaderError, ReadError, SampleError
from aioloader.engine.failures import (
    MIN_ATTEMPTED,
    FailurePolicy,
    give_up_message,
    judged_at_epoch_end,
    over_limit,
    reaches_minimum,
)
from aioloader.observe.stats import Counters


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_numbered_files(tmp_path_factory.mktemp("many"), 300)


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def loader_process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes: the pipeline in the trainer's process, or in a loader process (the
    test fails when a loader ran in the other one: ``runtimes``, conftest.py)."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


@pytest.fixture(autouse=True)
def quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aioloader")  # one WARNING per skipped file


def loader(files: list[str], bad: set[int], limit: int | float | None, **kwargs: object) -> Loader:
    settings: dict[str, object] = {"batch_size": 10, "shuffle": False, "num_workers": 2, "io_concurrency": 16}
    return Loader(
        files,
        decode=FailOn(bad),
        on_error="skip",
        max_failures=limit,
        **{**settings, **kwargs},  # type: ignore[arg-type]
    )


def numbers(batches: list[object]) -> list[int]:
    return [int(v) for b in batches for v in b.reshape(-1)]


def test_over_limit_rule() -> None:
    assert not over_limit(None, 10**6, 1)
    assert not over_limit(3, 3, 10) and over_limit(3, 4, 10)
    assert not over_limit(0.1, 99, 99)  # fewer than MIN_ATTEMPTED attempted: not judged yet
    assert over_limit(0.1, 11, MIN_ATTEMPTED) and not over_limit(0.1, 10, MIN_ATTEMPTED)


def test_judgement_points() -> None:
    """A fraction is judged once the count of samples attempted reaches MIN_ATTEMPTED (from
    below, however many a step adds) and at every epoch's end; a count only at failures."""
    assert reaches_minimum(0.5, MIN_ATTEMPTED - 1, MIN_ATTEMPTED) and reaches_minimum(0.5, 96, 104)
    assert reaches_minimum(0.5, 0, 250)  # a whole first epoch read at once
    assert not reaches_minimum(0.5, 90, 99) and not reaches_minimum(0.5, MIN_ATTEMPTED, 120)
    assert not reaches_minimum(3, 0, 250) and not reaches_minimum(None, 0, 250)
    assert judged_at_epoch_end(0.5) and judged_at_epoch_end(0.0)
    assert not judged_at_epoch_end(3) and not judged_at_epoch_end(None)


def test_give_up_message() -> None:
    last = ReadError("cannot read", path="f7", index=7)
    assert give_up_message(0.5, 80, 100, last) == (
        "too many failed samples: 80 of 100 attempted (max_failures=0.5); last: cannot read (sample 7: 'f7')"
    )
    # Only restored counts (load_state_dict), no failure seen by this loader itself.
    assert (
        give_up_message(0.2, 30, 140, None)
        == "too many failed samples: 30 of 140 attempted (max_failures=0.2)"
    )


def _fail(policy: FailurePolicy, index: int) -> None:
    policy.failed(ReadError("cannot read", path=f"f{index}", index=index))


def test_policy_judges_early_failures_when_100_were_attempted() -> None:
    """80 failures in the first 100 samples, none after: once 100 were attempted, not at
    the next failure (there is none). Reads start ahead of the failures they find."""
    policy = FailurePolicy("skip", 0.5, Counters())
    for k in range(9):  # samples 0-89 attempted, 10 at a time; 8 of each 10 fail
        policy.attempted(10)
        for i in range(8):
            _fail(policy, 10 * k + i)
    with pytest.raises(
        LoaderError, match=r"too many failed samples: 72 of 100 attempted \(max_failures=0\.5\); last"
    ) as info:
        policy.attempted(10)
    assert isinstance(info.value.__cause__, ReadError) and info.value.__cause__.index == 87


def test_policy_judges_at_epoch_end_what_no_failure_or_count_did() -> None:
    """Counts restored over the limit (a state saved by a run with a looser one), then an
    epoch without a failure: past 100 already, so only the epoch's end judges."""
    counters = Counters()
    counters.restore(samples=90, batches=9, failures={"DecodeError": 30}, attempted=120)
    policy = FailurePolicy("skip", 0.2, counters)
    policy.attempted(20)  # 140: no new judgement point
    with pytest.raises(
        LoaderError, match=r"^too many failed samples: 30 of 140 attempted \(max_failures=0\.2\)$"
    ):
        policy.epoch_ended()
    # Under the limit: nothing; a count (int) is not judged at the end of an epoch.
    FailurePolicy("skip", 0.25, counters).epoch_ended()
    FailurePolicy("skip", 3, counters).epoch_ended()


def test_policy_restored_attempts_reach_100_in_the_new_loader() -> None:
    """Restored counts, both of them, count toward the first judgement: 40 of 95 restored,
    and the new loader's first 10 reads reach 100."""
    counters = Counters()
    counters.restore(samples=55, batches=6, failures={"ReadError": 40}, attempted=95)
    policy = FailurePolicy("skip", 0.3, counters)
    with pytest.raises(LoaderError, match=r"40 of 105 attempted"):
        policy.attempted(10)


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
    # 4 failures in the first 4 samples: 100% of a few, 4% of the first 100, 1.3% of all.
    early = set(range(4))
    with frontend.opened(loader(files, early, 0.05)) as ld:
        assert len([v for b in frontend.epoch(ld) for v in b.reshape(-1)]) == 296
        stats = ld.stats
        assert stats.failures == 4 and stats.attempted == 300
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


# -- judged when due: failures that all came early are not let pass ---------------------------


def test_early_failures_are_judged_when_100_samples_were_attempted(
    frontend: Driver, files: list[str], loader_process: bool
) -> None:
    """80 failures among the first 100 samples of 150, none after. Two batches built at
    once (``io_concurrency`` under the batch size): every failure is found before 100
    samples were attempted, so none is judged at its failure; the count reaching 100 judges
    them all (80 of 100), in the place of the batch that reached it."""
    with frontend.opened(
        loader(files[:150], set(range(80)), 0.5, io_concurrency=4, loader_process=loader_process)
    ) as ld:
        got: list[int] = []
        with pytest.raises(
            LoaderError, match=r"too many failed samples: 80 of \d+ attempted \(max_failures=0\.5\)"
        ) as info:
            frontend.for_each(ld, lambda b: got.extend(numbers([b])))
        assert not isinstance(info.value, SampleError)
        assert got == list(range(80, 80 + len(got))) and len(got) < 70  # in order; the epoch stopped


def test_a_ratio_over_the_limit_is_not_let_pass(
    frontend: Driver, files: list[str], loader_process: bool
) -> None:
    """120 samples, the failures all in the first 30 (25% of the epoch, over 20%), none
    after them, each found before 100 samples were attempted: the LoaderError arrives, after
    good batches only, in order. The count reaching 100 judges them here (30 of 100); the
    epoch's end (30 of 120) would too. Within one loader the count comes first: the end
    alone judges counts restored over the limit (the next test)."""
    with frontend.opened(loader(files[:120], set(range(30)), 0.2, loader_process=loader_process)) as ld:
        got: list[int] = []
        with pytest.raises(
            LoaderError, match=r"too many failed samples: 30 of \d+ attempted \(max_failures=0\.2\)"
        ):
            frontend.for_each(ld, lambda b: got.extend(numbers([b])))
        assert got == list(range(30, 30 + len(got)))


def test_resumed_counts_over_the_limit_are_judged_at_the_epochs_end(
    frontend: Driver, files: list[str], loader_process: bool
) -> None:
    """A run without a limit reads 100 of 120 samples, the 30 failures all early; resumed
    with ``max_failures=0.2``, the rest has no failure and the count is past 100 already:
    the epoch's end judges 30 of 120 or more, and the LoaderError is the epoch's last item,
    after all its batches."""
    bad = set(range(30))
    with frontend.opened(loader(files[:120], bad, None, loader_process=loader_process)) as ld:
        assert numbers(frontend.take(ld, 7)) == list(range(30, 100))  # three empty batches skipped
        state = ld.state_dict()
    assert state["stats"]["attempted"] >= 100
    with frontend.opened(loader(files[:120], bad, 0.2, loader_process=loader_process)) as resumed:
        resumed.load_state_dict(state)
        got: list[int] = []
        # No "; last: ...": this loader saw no failure itself.
        with pytest.raises(
            LoaderError, match=r"^too many failed samples: 30 of \d+ attempted \(max_failures=0\.2\)(?!;)"
        ):
            frontend.for_each(resumed, lambda b: got.extend(numbers([b])))
        assert got == list(range(100, 120))  # every batch, then the error


def test_a_ratio_under_the_limit_passes_every_epoch(
    frontend: Driver, files: list[str], loader_process: bool
) -> None:
    """10 failures in 150 (6.7%, under 10%), some early: two whole epochs, every good sample
    once in each; neither the count reaching 100 nor an epoch's end gives up."""
    bad = set(range(0, 150, 15))
    with frontend.opened(loader(files[:150], bad, 0.1, loader_process=loader_process)) as ld:
        for epoch in range(2):
            ld.set_epoch(epoch)
            assert numbers(frontend.epoch(ld)) == [i for i in range(150) if i not in bad]
        assert ld.stats.failures == 20 and ld.stats.attempted == 300

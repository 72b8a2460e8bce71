"""The Ray path's decisions, without Ray or a loop: what a task that failed without an
answer becomes for each of its samples (``aioloader/cluster/faults.py``), the cluster's
figures and the bottleneck's advice for them, the arguments ``decode_on`` refuses, and
the user's own modules going to the cluster by value."""

from __future__ import annotations

import importlib
import pickle
import re
import sys
from pathlib import Path

import pytest
from helpers import make_config

from aioloader.base import sendable
from aioloader.cluster.faults import MAX_LOST, Kind, Recovery, kind_of
from aioloader.config import LoaderConfig
from aioloader.observe.bottleneck import diagnose
from aioloader.observe.stages import StageStats
from aioloader.observe.stats import Counters


def _named(name: str) -> BaseException:
    """An exception whose class has Ray's name for it (the rules go by class name)."""
    return type(name, (Exception,), {})()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("WorkerCrashedError", Kind.CRASH),
        ("NodeDiedError", Kind.CRASH),
        ("OutOfMemoryError", Kind.CRASH),
        ("TaskCancelledError", Kind.STUCK),
        ("ObjectLostError", Kind.LOST),
        ("OwnerDiedError", Kind.LOST),
        ("RayTaskError", Kind.FATAL),
        ("ValueError", Kind.FATAL),
    ],
)
def test_ray_errors_sorted_by_what_they_mean(name: str, kind: Kind) -> None:
    assert kind_of(_named(name)) is kind


def test_a_subclass_is_sorted_by_its_ray_base() -> None:
    base = type("WorkerCrashedError", (Exception,), {})
    assert kind_of(type("Whatever", (base,), {})()) is Kind.CRASH


def test_a_crashed_chunk_is_split_and_nobody_is_blamed() -> None:
    rec = Recovery()
    nxt = rec.failed([3, 4, 5], Kind.CRASH)
    assert nxt.again == [[3], [4], [5]]
    assert not (nxt.poison or nxt.timed_out or nxt.give_up)
    assert rec.crashes == {}


def test_a_sample_alone_that_crashes_twice_is_poison() -> None:
    rec = Recovery()
    rec.failed([1, 2], Kind.CRASH)  # split: not charged
    first = rec.failed([2], Kind.CRASH)
    assert first.again == [[2]] and not first.poison
    second = rec.failed([2], Kind.CRASH)
    assert second.poison == [2] and second.again == []
    # Another sample's crash is its own count.
    assert rec.failed([1], Kind.CRASH).again == [[1]]


def test_a_stuck_sample_alone_times_out_a_stuck_chunk_is_split() -> None:
    rec = Recovery()
    assert rec.failed([7, 8], Kind.STUCK).again == [[7], [8]]
    nxt = rec.failed([8], Kind.STUCK)
    assert nxt.timed_out == [8] and nxt.again == [] and not nxt.poison


def test_lost_answers_are_sent_again_then_given_up_on() -> None:
    rec = Recovery()
    for _ in range(MAX_LOST):
        nxt = rec.failed([0, 1], Kind.LOST)
        assert nxt.again == [[0, 1]] and not nxt.give_up
    assert rec.failed([0, 1], Kind.LOST).give_up
    rec2 = Recovery()
    for _ in range(MAX_LOST):
        rec2.failed([0], Kind.LOST)
    rec2.answered()  # an answer in between: the count starts again
    assert not rec2.failed([0], Kind.LOST).give_up


def test_cluster_stats_split_the_round_trip() -> None:
    now = [0.0]
    counters = Counters(clock=lambda: now[0])
    now[0] = 10.0
    counters.cluster_task(2, 16, round_trip=0.5, decode=0.3, read=0.1)
    now[0] = 12.0
    counters.cluster_task(2, 16, round_trip=0.5, decode=0.3, read=0.1)
    c = counters.cluster
    assert c is not None
    assert (c.tasks, c.samples, c.slots) == (2, 32, 2)
    assert c.transfer_seconds == pytest.approx(0.2)
    # From the first task's start (10.0 - 0.5) to the last answer (12.0), two slots.
    assert c.elapsed_seconds == pytest.approx(2.5)
    assert c.busy_share == pytest.approx(0.8 / 5.0)
    assert "32 samples" in str(c) and "transfer" in str(c)


def _decode_bound() -> dict[str, StageStats]:
    def stage(name: str, in_flight: float, bound: int, capacity: int, busy: float) -> StageStats:
        return StageStats(name, 100, busy, 10.0, 0, in_flight * 10.0, bound, capacity)

    return {
        "read": stage("read", 1, 64, 64, 5.0),
        "decode": stage("decode", 7.8, 8, 4, 10.0),
        "collate": stage("collate", 0.1, 1, 1, 1.0),
        "transfer": stage("transfer", 0.1, 1, 1, 1.0),
    }


@pytest.mark.parametrize(("busy", "says"), [(0.9, "add CPUs to the Ray cluster"), (0.3, "transfer")])
def test_the_verdict_on_the_ray_path_says_cpus_or_transfer(busy: float, says: str) -> None:
    verdict = diagnose(_decode_bound(), 0.6, num_workers=4, io_concurrency=64, cluster_busy=busy)
    assert verdict.stage == "decode"
    assert says in verdict.advice and "Ray tasks in flight" in verdict.advice
    local = diagnose(_decode_bound(), 0.6, num_workers=4, io_concurrency=64)
    assert "raise num_workers" in local.advice


def _config(**kw: object) -> LoaderConfig:
    config: LoaderConfig = make_config(**{"decode": len, "shuffle": False, "num_workers": None, **kw})
    return config


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"decode_on": "cluster"}, "decode_on='cluster' must be 'local' or 'ray'"),
        ({"decode_on": "ray", "decode": None}, "decode_on='ray' needs a decode"),
        ({"decode_on": "ray", "num_workers": "auto"}, "num_workers='auto' cannot go with decode_on='ray'"),
        ({"decode_on": "ray", "loader_process": True}, "loader_process=True cannot go with decode_on='ray'"),
    ],
)
def test_decode_on_refuses_what_cannot_go_with_it(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        _config(**kw)


def test_decode_on_ray_settings() -> None:
    pytest.importorskip("ray")
    cfg = _config(decode_on="ray")
    assert (
        cfg.decoding.decode_on,
        cfg.build.cluster_tasks,
        cfg.delivery.loader_process,
        cfg.build.start_in,
    ) == (
        "ray",
        None,
        "auto",
        "thread",
    )
    assert _config(decode_on="ray", num_workers=6).build.cluster_tasks == 6
    assert _config().decoding.decode_on == "local" and _config().build.cluster_tasks is None


def test_the_users_own_module_goes_to_the_cluster_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "myaugment_cluster.py").write_text("SCALE = 3\n\ndef triple(b):\n    return len(b) * SCALE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("myaugment_cluster")
    try:
        assert mod in sendable.user_modules()
        assert sendable.user_modules().count(pickle) == 0  # the standard library is installed code
        local = sendable.dumps(mod.triple, "decode", "workers")
        remote = sendable.dumps(mod.triple, "decode", "the cluster", elsewhere=True)
        del sys.modules["myaugment_cluster"]  # as on a machine without the file
        sys.path.remove(str(tmp_path))
        with pytest.raises(Exception, match="myaugment_cluster"):
            sendable.loads(local, "decode")
        assert sendable.loads(remote, "decode")(b"ab") == 6
    finally:
        sys.modules.pop("myaugment_cluster", None)

"""``decode_on="ray"`` against a real Ray instance on this machine (2 CPUs, started once for
the module): the same batches as the local decode, sample for sample; resume and ranks;
errors with their path, cause and traceback; any callable, sent by value; URLs read by the
tasks; close; stats. The faults (dead workers, poison samples, timeouts) are in
test_ray_faults.py, a node removed mid-epoch in test_ray_nodes.py, the errors without a
cluster or without Ray, and the settings refused, in test_ray_connect.py (which starts no
Ray: ``ray.init(address="auto")`` would find this module's).

The leak check (conftest.py) leaves Ray's own processes, threads and descriptors out while
Ray is connected (helpers.ray_processes); ``raykit.cluster_cpus_free`` adds what it cannot
see: after each test, no task of a closed loader still holds a CPU of the cluster.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from faults import Fault
from frontends import Driver
from helpers import (
    FailOn,
    SlowDecode,
    decode_number,
    flatten,
    is_ray_fd,
    is_ray_thread,
    named,
    process_name,
    process_tree,
    random_draw,
    ray_processes,
)

from aioloader import DecodeError, FileDataset, ImageDecoder, Loader, LoaderError, ReadError

ray = pytest.importorskip("ray")

from raykit import (  # noqa: E402 - after the skip: it imports ray
    cluster_cpus_free,  # noqa: F401 - autouse fixture
    local_loader,
    ray_instance,  # noqa: F401 - autouse fixture
    ray_loader,
    wait_cpus_busy,
    wait_cpus_free,
)


def epochs(frontend: Driver, loader: Loader, n: int = 2) -> list[list[Any]]:
    out = []
    with frontend.opened(loader):
        for ep in range(n):
            loader.set_epoch(ep)
            out.append(frontend.epoch(loader))
    return out


def assert_same_batches(a: list[list[Any]], b: list[list[Any]]) -> None:
    """Equal epoch for epoch, batch for batch, tensor for tensor (labels too)."""
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb, strict=True):
            xa = list(ba) if isinstance(ba, (tuple, list)) else [ba]
            xb = list(bb) if isinstance(bb, (tuple, list)) else [bb]
            assert len(xa) == len(xb)
            for ta, tb in zip(xa, xb, strict=True):
                assert torch.equal(ta, tb), (ta, tb)


# -- 1. the same batches as the local decode, and 10. through every front-end ----------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_same_batches_as_local_with_seeded_augmentation(
    frontend: Driver, numbered: list[str], shuffle: bool
) -> None:
    """random_draw: the number and a draw of sample_rng(), seeded by (seed, epoch, index):
    over two epochs the Ray tasks give exactly the local workers' batches, in their order."""
    kw: dict[str, Any] = {"batch_size": 8, "decode": random_draw, "shuffle": shuffle, "seed": 7}
    got = epochs(frontend, ray_loader(numbered, **kw))
    want = epochs(frontend, local_loader(numbered, **kw))
    assert_same_batches(got, want)
    # The draws are the sample's, not the epoch's or the worker's: they differ by epoch.
    first = {int(r[0]): float(r[1]) for r in torch.cat(got[0])}
    second = {int(r[0]): float(r[1]) for r in torch.cat(got[1])}
    assert sorted(first) == sorted(second) == list(range(37))
    assert first != second
    if not shuffle:
        assert flatten([b[:, 0].long() for b in got[0]]) == list(range(37))


def test_images_with_labels_and_random_crops_equal_local(frontend: Driver, image_folder: Path) -> None:
    """Real JPEGs with their class labels, a random-resized crop and flips (seeded per
    sample): batches and labels equal the local decode's."""
    ds = FileDataset.from_folder(image_folder)
    decoder = ImageDecoder(24, crop="random", hflip=True)
    kw: dict[str, Any] = {"batch_size": 8, "decode": decoder, "shuffle": True, "seed": 3}
    got = epochs(frontend, ray_loader(ds, **kw))
    want = epochs(frontend, local_loader(ds, **kw))
    assert_same_batches(got, want)
    labels = torch.cat([b[1] for b in got[0]])
    assert sorted(labels.tolist()) == sorted(ds.labels.tolist())  # type: ignore[union-attr]


def test_unordered_delivers_every_sample_with_its_draw(frontend: Driver, numbered: list[str]) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "decode": random_draw, "shuffle": True}
    (got,) = epochs(frontend, ray_loader(numbered, ordered=False, **kw), 1)
    (want,) = epochs(frontend, local_loader(numbered, **kw), 1)
    rows = {int(r[0]): float(r[1]) for r in torch.cat(got)}
    assert len(torch.cat(got)) == 37
    assert rows == {int(r[0]): float(r[1]) for r in torch.cat(want)}


def test_every_front_end_iterates(frontend: Driver, numbered: list[str]) -> None:
    """for/async for inside with/async with, next/anext, and a lazy start without with."""
    loader = ray_loader(numbered, batch_size=8, decode=decode_number, shuffle=False)
    it = frontend.iter(loader)  # starts it: no with
    try:
        assert flatten([frontend.next(it)]) == list(range(8))
        assert flatten(frontend.rest(it)) == list(range(8, 37))
        assert loader.runtime == "thread"
    finally:
        frontend.close(loader)
    with frontend.opened(ray_loader(numbered, batch_size=8, decode=decode_number, shuffle=False)) as again:
        assert flatten(frontend.epoch(again)) == list(range(37))


# -- 2. resume and ranks ------------------------------------------------------------------------


@pytest.mark.parametrize("stop_at", [0, 2, 4])
def test_resume_mid_epoch_gives_exactly_the_remaining_batches(
    frontend: Driver, numbered: list[str], stop_at: int
) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "decode": decode_number, "shuffle": True, "prefetch": 2}
    with frontend.opened(ray_loader(numbered, **kw)) as loader:
        reference = [flatten([b]) for b in frontend.epoch(loader)]
    with frontend.opened(ray_loader(numbered, **kw)) as first:
        before = [flatten([b]) for b in frontend.take(first, stop_at)]
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint file would
    with frontend.opened(ray_loader(numbered, **kw)) as second:
        second.load_state_dict(state)
        after = [flatten([b]) for b in frontend.epoch(second)]
    assert before == reference[:stop_at]
    assert after == reference[stop_at:]


def test_rank_shards_equal_local(frontend: Driver, numbered: list[str]) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "decode": decode_number, "shuffle": True, "world_size": 3}
    shards = []
    for rank in range(3):
        (got,) = epochs(frontend, ray_loader(numbered, rank=rank, **kw), 1)
        (want,) = epochs(frontend, local_loader(numbered, rank=rank, **kw), 1)
        assert_same_batches([got], [want])
        shards.append(flatten(got))
    assert set().union(*map(set, shards)) == set(range(37))
    assert len({len(s) for s in shards}) == 1  # padded to equal shards


# -- 3. errors of samples ---------------------------------------------------------------------


class UsersOwnError(Exception):
    """An exception class of the test module: Ray's workers cannot import it by name."""


def test_skip_drops_the_failed_samples_and_counts_them(frontend: Driver, numbered: list[str]) -> None:
    loader = ray_loader(numbered, batch_size=8, decode=FailOn({3, 20}), on_error="skip", shuffle=False)
    with frontend.opened(loader):
        got = flatten(frontend.epoch(loader))
        stats = loader.stats
    assert got == [i for i in range(37) if i not in (3, 20)]
    assert stats.failures == 2 and stats.failures_by_reason == {"DecodeError": 2}
    assert set(stats.last_failed_paths) == {numbered[3], numbered[20]}


def test_max_failures_gives_up(frontend: Driver, numbered: list[str]) -> None:
    loader = ray_loader(
        numbered,
        batch_size=8,
        decode=FailOn(set(range(0, 37, 2))),
        on_error="skip",
        max_failures=3,
        shuffle=False,
    )
    with frontend.opened(loader), pytest.raises(LoaderError, match="too many failed samples"):
        frontend.epoch(loader)


def test_raise_names_the_path_with_the_users_exception_and_traceback(
    frontend: Driver, numbered: list[str]
) -> None:
    """The user's own exception class (of this test module, and one made in a closure)
    comes back as the DecodeError's cause, the very class: ``except UsersOwnError`` works."""

    class ClosureError(Exception):
        pass

    def failing(cls: type[Exception]) -> Callable[[bytes], np.ndarray]:
        def decode(data: bytes) -> np.ndarray:
            value = decode_number(data)
            if int(value[0]) == 11:
                raise cls("sample eleven is bad")
            return value

        return decode

    for cls in (UsersOwnError, ClosureError):
        loader = ray_loader(numbered, batch_size=4, decode=failing(cls), shuffle=False)
        with frontend.opened(loader):
            with pytest.raises(DecodeError) as info:
                frontend.epoch(loader)
            err = info.value
            assert err.path == numbered[11] and err.index == 11
            assert numbered[11] in str(err)
            assert type(err.__cause__) is cls, type(err.__cause__)
            assert str(err.__cause__) == "sample eleven is bad"
            assert "in decode" in err.worker_traceback and cls.__name__ in err.worker_traceback
            # Usable afterwards: the next iteration delivers the batches before the bad sample.
            it = frontend.iter(loader)
            assert flatten([frontend.next(it), frontend.next(it)]) == list(range(8))


# -- 4. any callable -----------------------------------------------------------------------------


class AddOffset:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self, data: bytes) -> np.ndarray:
        return decode_number(data) + self.offset


def test_any_callable_goes_by_value(frontend: Driver, numbered: list[str], tmp_path: Path) -> None:
    """A lambda, a closure, a callable object and a function of a module that only this
    process can import (a file in tmp_path put on sys.path here: Ray's workers do not have
    it) all decode on the cluster."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "only_here_decoders.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            FACTOR = 1000

            def times_factor(data):
                return np.array([int(data.decode()[7:]) * FACTOR], dtype=np.int64)
            """
        )
    )
    sys.path.insert(0, str(folder))
    try:
        import only_here_decoders  # type: ignore[import-not-found]

        offset = 5
        cases: list[tuple[Callable[[bytes], Any], Callable[[int], int]]] = [
            (lambda data: decode_number(data) * 2, lambda i: 2 * i),
            (lambda data: decode_number(data) + offset, lambda i: i + 5),
            (AddOffset(100), lambda i: i + 100),
            (only_here_decoders.times_factor, lambda i: i * 1000),
        ]
        for decode, expect in cases:
            loader = ray_loader(numbered, batch_size=8, decode=decode, shuffle=False)
            with frontend.opened(loader):
                assert flatten(frontend.epoch(loader)) == [expect(i) for i in range(37)]
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("only_here_decoders", None)


# -- 5. URLs read by the tasks --------------------------------------------------------------------


def test_http_urls_are_read_by_the_tasks(frontend: Driver, http_files: str, numbered: list[str]) -> None:
    urls = [f"{http_files}/{os.path.basename(p)}" for p in numbered]
    missing = f"{http_files}/nope.txt"
    loader = ray_loader(urls, batch_size=8, decode=decode_number, shuffle=False)
    with frontend.opened(loader):
        assert flatten(frontend.epoch(loader)) == list(range(37))
        stats = loader.stats
    assert stats.cluster is not None and stats.cluster.read_seconds > 0
    # Read on the cluster, counted here all the same.
    assert stats.bytes_read == sum(len(Path(p).read_bytes()) for p in numbered)
    loader = ray_loader([*urls[:5], missing, *urls[5:9]], batch_size=4, decode=decode_number, shuffle=False)
    with frontend.opened(loader), pytest.raises(ReadError) as info:
        frontend.epoch(loader)
    assert info.value.path == missing and info.value.index == 5 and missing in str(info.value)
    loader = ray_loader(
        [*urls[:5], missing, *urls[5:9]], batch_size=4, decode=decode_number, shuffle=False, on_error="skip"
    )
    with frontend.opened(loader):
        assert flatten(frontend.epoch(loader)) == list(range(9))
        assert loader.stats.failures_by_reason == {"ReadError": 1}
        assert loader.stats.last_failed_paths == (missing,)


def test_s3_urls_with_storage_options(
    frontend: Driver, moto_s3: dict[str, object], numbered: list[str]
) -> None:
    urls = [f"s3://aioloader-test/numbered/{os.path.basename(p)}" for p in numbered]
    missing = "s3://aioloader-test/numbered/nope.txt"
    kw: dict[str, Any] = {"batch_size": 8, "decode": decode_number, "storage_options": moto_s3}
    loader = ray_loader(urls, shuffle=True, **kw)
    with frontend.opened(loader):
        got = flatten(frontend.epoch(loader))
    assert sorted(got) == list(range(37)) and got != list(range(37))
    loader = ray_loader([*urls[:3], missing], shuffle=False, **kw)
    with frontend.opened(loader), pytest.raises(ReadError) as info:
        frontend.epoch(loader)
    assert info.value.path == missing and missing in str(info.value)
    # Credentials cross to the cluster but are never shown.
    assert str(S3_SECRET) not in str(info.value)


S3_SECRET = "testing-secret-do-not-show"


# -- 7. close ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_close_cancels_the_tasks_in_flight_and_leaves_ray_connected(
    frontend: Driver, numbered: list[str]
) -> None:
    """Samples past the first batch take a minute to decode, in one blocking call (which
    Ray's plain cancel cannot interrupt): after the first batch, tasks for the next ones
    hold both CPUs; close() must end them (the CPUs come free within seconds, not a
    minute), and the Ray connection, the user's, stays open for the next loader. Then the
    same with the epoch left by ``break`` before close."""
    hang = Fault("hang", set(range(4, 37)), seconds=60)
    # One task decoding at once, two in flight: the next batch's two tasks are sent only
    # once the first batch's are answered (Ray need not start queued tasks in the order they
    # were sent: with more in flight, hanging ones could hold both CPUs before the first
    # batch's), and then run on both CPUs.
    kw: dict[str, Any] = {"batch_size": 4, "decode": hang, "shuffle": False, "num_workers": 1}
    loader = ray_loader(numbered, **kw)
    with frontend.opened(loader):
        it = frontend.iter(loader)
        assert flatten([frontend.next(it)]) == [0, 1, 2, 3]
        assert wait_cpus_busy(2) == 2  # the next batches' tasks run (and hang)
    assert ray.is_initialized()
    assert wait_cpus_free() == 0
    loader = ray_loader(numbered, **kw)
    with frontend.opened(loader):
        assert flatten(frontend.take(loader, 1)) == [0, 1, 2, 3]
    assert ray.is_initialized()
    assert wait_cpus_free() == 0
    with frontend.opened(ray_loader(numbered, batch_size=8, decode=decode_number, shuffle=False)) as again:
        assert flatten(frontend.epoch(again)) == list(range(37))
    assert ray.is_initialized()


# -- 9. stats --------------------------------------------------------------------------------------


def test_stats_count_the_clusters_tasks(frontend: Driver, numbered: list[str]) -> None:
    loader = ray_loader(numbered, batch_size=8, decode=decode_number, shuffle=False)
    with frontend.opened(loader):
        frontend.epoch(loader)
        s = loader.stats
    assert s.cluster is not None
    assert s.cluster.tasks > 0 and s.cluster.samples == 37 == s.samples
    decode = s.stages["decode"]
    assert decode.items == 37
    # Twice the tasks decoding at once (as many as the module's cluster has CPUs: 2).
    assert s.cluster.slots == 2 and decode.bound == 2 * s.cluster.slots
    assert local_stats_have_no_cluster(numbered)


def local_stats_have_no_cluster(numbered: list[str]) -> bool:
    with local_loader(numbered[:4], batch_size=4, decode=decode_number) as loader:
        list(loader)
        return loader.stats.cluster is None


@pytest.mark.slow
def test_a_slow_decode_is_named_the_bottleneck_with_the_clusters_advice(
    frontend: Driver, numbered: list[str]
) -> None:
    loader = ray_loader(numbered, batch_size=4, decode=SlowDecode(0.05), shuffle=False, prefetch=1)
    with frontend.opened(loader):
        frontend.epoch(loader)
        s = loader.stats
    assert s.bottleneck is not None and s.bottleneck.stage == "decode"
    assert s.cluster is not None
    # The Ray path's advice (observe/bottleneck.py), not the local workers'.
    assert "Ray tasks in flight" in s.bottleneck.advice
    # Which advice depends on how busy the cluster's slots were (a loaded machine: less).
    if s.cluster.busy_share >= 0.7:
        assert "add CPUs to the Ray cluster" in s.bottleneck.advice and "num_workers" in s.bottleneck.advice
    else:
        assert "the transfer from the cluster is the limit" in s.bottleneck.advice


# -- the leak check, while Ray is connected -----------------------------------------------------


def test_the_leak_check_leaves_out_rays_own_and_nothing_of_aioloaders(
    numbered: list[str], tmp_path: Path
) -> None:
    """conftest.py's ``no_leaks`` leaves out Ray's threads, processes and descriptors while
    Ray is connected (helpers.ray_processes, is_ray_thread, is_ray_fd), and only those: an
    ``aioloader-*`` thread, a regular file and a local loader's decode workers still count."""
    import conftest

    ours = [t for t in threading.enumerate() if is_ray_thread(t)]
    assert ours, "Ray's own Python threads (its GC and error-listening threads)"
    assert not any(f"{t.name}#{t.ident}" in conftest._threads() for t in ours)
    rays = ray_processes(process_tree())
    assert {"gcs_server", "raylet"} <= {process_name(p) for p in rays}
    assert not any(is_ray_fd(link.split("->", 1)[1]) for link in conftest._fds())

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="aioloader-leakcheck")
    thread.start()
    try:
        with open(tmp_path / "held", "w"):
            assert f"aioloader-leakcheck#{thread.ident}" in conftest._threads()
            assert any(link.endswith(f"{os.sep}held") for link in conftest._fds())
        with local_loader(numbered, batch_size=8, decode=decode_number) as loader:
            next(iter(loader))
            workers = named("aioloader-work")  # a decode worker's comm
            assert workers and not workers & ray_processes(process_tree())
    finally:
        stop.set()
        thread.join()

"""The decode stage's contract (aioloader/decode/contract.py): both stages keep it, the stage
is chosen once where the loader is built (aioloader/engine/decoding.py), hot start is a
decoder's declaration; and what a worker's death makes of the rows it had (pure)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from helpers import make_config

from aioloader import ImageDecoder, Loader
from aioloader.cluster.stage import RayDecodeStage, cluster_chunk
from aioloader.decode.contract import DecodeStageLike, declares_hot_start
from aioloader.decode.faults import POISON_CRASHES, Breakage, Fate, describe_deaths, fate, sort_out
from aioloader.decode.stage import DecodeStage
from aioloader.engine.decoding import closed_slabs, decode_stage
from aioloader.engine.sizing import chunk_size
from aioloader.errors import DecodeError, LoaderTimeoutError
from aioloader.observe.stats import Counters


def _local(workers: int = 3, chunk: int = 5, hot: bool = False) -> DecodeStage:
    pool: Any = SimpleNamespace(num_workers=workers)  # what the stage asks of it when made
    return DecodeStage(
        bytes,
        pool,
        chunk=chunk,
        seed=0,
        sample_timeout=None,
        path_of=str,
        hot=hot,
        local=None,  # type: ignore[arg-type]
        on_restart=lambda _: None,
    )


def _ray(tasks: int = 4, chunk: int = 32, reads_urls: bool = True) -> RayDecodeStage:
    session: Any = SimpleNamespace(tasks=tasks, bound=2 * tasks)
    return RayDecodeStage(
        session,
        chunk=chunk,
        reads_urls=reads_urls,
        seed=0,
        sample_timeout=None,
        read_retries=0,
        storage_options=None,
        io_concurrency=8,
        path_of=str,
        counters=Counters(),
    )


def test_both_stages_keep_the_contract() -> None:
    local, ray = _local(), _ray()
    assert isinstance(local, DecodeStageLike) and isinstance(ray, DecodeStageLike)
    # The local pool: one probe per worker, fed by the reader's reads, URLs read by the reader.
    assert (local.chunk, local.probes, local.samples_in_flight, local.reads_urls) == (5, 3, 0, False)
    # Ray: no probes, every task slot's chunk in flight beyond the reader's limit.
    assert (ray.chunk, ray.probes, ray.samples_in_flight, ray.reads_urls) == (32, 0, 8 * 32, True)
    assert not _ray(reads_urls=False).reads_urls
    assert local.active == 3 and ray.active == 4
    local.set_workers(9)
    assert local.active == 3  # clamped to the pool
    local.set_workers(0)
    assert local.active == 1
    ray.set_workers(1)
    assert ray.active == 4  # the cluster's tasks are not tuned


def _stage(dataset: Any, counters: Counters, pool: Any, cluster: Any, **kw: Any) -> Any:
    """The stage ``decode_stage`` chooses for a loader of batches of 64, two workers and
    eight reads in flight (``kw`` overriding its arguments)."""
    given = {"batch_size": 64, "num_workers": 2, "decode": bytes, "seed": 0, "read_retries": 0}
    config = make_config(**{**given, **kw})
    parts = (config.sampling, config.reading, config.decoding, config.failures)
    return decode_stage(parts, config.build.workers, 8, dataset, counters, pool, cluster, None)  # type: ignore[arg-type]


def test_the_stage_is_chosen_once_where_the_loader_is_built() -> None:
    counters, dataset = Counters(), SimpleNamespace(path=str, has_spans=False)
    pool: Any = SimpleNamespace(num_workers=2)
    cluster: Any = SimpleNamespace(tasks=3, bound=6)
    local = _stage(dataset, counters, pool, None)
    assert isinstance(local, DecodeStage)
    assert (local.chunk, local.probes) == (chunk_size(64, 2), 2)
    ray = _stage(dataset, counters, None, cluster)
    assert isinstance(ray, RayDecodeStage)
    assert (ray.chunk, ray.reads_urls, ray.samples_in_flight) == (cluster_chunk(64, 3), True, 6 * ray.chunk)
    # A custom read, or byte ranges of a file: the reader reads, the tasks get bytes.
    ray = _stage(dataset, counters, None, cluster, read=open)
    assert ray is not None and not ray.reads_urls
    spans = SimpleNamespace(path=str, has_spans=True)
    ray = _stage(spans, counters, None, cluster)
    assert ray is not None and not ray.reads_urls
    # decode=None: no stage at all.
    assert _stage(dataset, counters, None, None, decode=None) is None


def test_forget_names_the_slabs_closed_lately_of_every_pool() -> None:
    rows = SimpleNamespace(recently_closed=lambda: ("a", "b"))
    arenas = SimpleNamespace(recently_closed=lambda: ("c",))
    assert closed_slabs(rows, None, arenas)() == ("a", "b", "c")  # type: ignore[arg-type]
    assert closed_slabs(None, None)() == ()


class _Declares:
    hot_start = True

    def __call__(self, data: bytes) -> np.ndarray:
        return np.zeros(1)


class _SaysSomethingElse:
    hot_start = "yes"


class _MyImageDecoder(ImageDecoder):
    pass


def _function(data: bytes) -> np.ndarray:
    return np.zeros(1)


def test_hot_start_is_declared_by_the_decoder_not_a_class_the_engine_checks() -> None:
    assert ImageDecoder.hot_start is True
    assert declares_hot_start(ImageDecoder(32))
    assert declares_hot_start(_MyImageDecoder(32))  # inherited, as isinstance had it
    assert declares_hot_start(_Declares())
    assert not declares_hot_start(_function)  # a user's function: workers only
    assert not declares_hot_start(lambda data: data)
    assert not declares_hot_start(_SaysSomethingElse())  # only True declares it
    assert _local(hot=True)._hot and not _local(hot=False)._hot


def test_a_loader_holds_a_stage_by_its_contract(tmp_path: Path) -> None:
    files = []
    for i in range(4):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(bytes([i]) * 16)
        files.append(str(path))
    with Loader(
        files, batch_size=2, decode=_first_byte, num_workers=1, shuffle=False, loader_process=False
    ) as loader:
        stage = loader._runtime.engine._stage  # type: ignore[union-attr]
        assert isinstance(stage, DecodeStageLike) and isinstance(stage, DecodeStage)
        assert [int(x) for b in loader for x in b] == [0, 1, 2, 3]
    with Loader(files, batch_size=2, decode=None, shuffle=False, loader_process=False) as loader:
        assert loader._runtime.engine._stage is None  # type: ignore[union-attr]
        assert [bytes(x)[:1] for b in loader for x in b] == [bytes([i]) for i in range(4)]


def _first_byte(data: bytes) -> np.ndarray:
    return np.array(data[0], dtype=np.int64)


# -- what a worker's death makes of the rows in flight (decode/faults.py), pure ---------------


def test_a_rows_fate_is_judged_by_the_worker_it_was_on() -> None:
    broke = Breakage(dead={11: -9, 12: 3}, timed_out=frozenset({11}))
    assert fate(11, broke, 0) is Fate.TIMED_OUT  # killed by the loader for sample_timeout
    assert fate(12, broke, 0) is Fate.CRASHED_ONCE  # crashed: decoded again, counted
    assert fate(12, broke, 1) is Fate.POISON  # a second crashed worker under it
    assert fate(13, broke, 1) is Fate.AGAIN  # alive: another worker's death broke the pool
    assert fate(0, broke, 5) is Fate.AGAIN  # queued, on no worker
    assert POISON_CRASHES == 2


def test_a_broken_chunk_is_sorted_out_row_by_row() -> None:
    items = [(0, 100, b"a"), (1, 101, b"b"), (2, 102, b"c"), (3, 103, b"d")]
    broke = Breakage(dead={7: -11, 8: -9}, timed_out=frozenset({8}))
    # Row 0 on the crashed worker for the first time, row 1 for the second, row 2 on the
    # worker killed for its timeout, row 3 queued.
    judged = sort_out(items, [7, 7, 8, 0], broke, {1: 1}, timeout=2.5, path_of=lambda i: f"f{i}")
    assert judged.again == [items[0], items[3]]
    assert judged.crashes == {0: 1, 1: 2}
    assert sorted(judged.ended) == [1, 2]
    poison, slow = judged.ended[1], judged.ended[2]
    assert isinstance(poison, DecodeError) and not isinstance(poison, LoaderTimeoutError)
    assert str(poison).startswith("decode worker pid 7 died of SIGSEGV, twice")
    assert (poison.path, poison.index) == ("f101", 101)
    assert isinstance(slow, LoaderTimeoutError) and "sample_timeout=2.5s" in str(slow)
    assert (slow.path, slow.index) == ("f102", 102)
    crashes = {1: 1}
    sort_out(items, [7, 7, 8, 0], broke, crashes, timeout=None, path_of=str)
    assert crashes == {1: 1}  # pure: the counts given are left alone


def test_the_dead_are_described_by_signal_or_exit_code() -> None:
    assert describe_deaths({12: -9, 3: 4}) == "pid 3 exited with code 4, pid 12 died of SIGKILL"
    assert describe_deaths({}) == "(unknown pid) died"
    from aioloader.decode import pool

    assert pool.Breakage is Breakage and pool.describe_deaths is describe_deaths  # still there too

"""Byte ranges of one file asked together are read as one (``read/routing.py``'s
``coalesce``, ``FileReader.fetch_many``): pure, then through loaders over a local file and a
loopback HTTP server, counting the reads and the requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aioloader import FileDataset, Loader
from aioloader.read.routing import coalesce

#: 20 samples of 1,000 bytes, each followed by 200 bytes of other members (as in a tar).
SAMPLES = [bytes([i]) * 1000 for i in range(20)]
STRIDE = 1200


def test_ranges_close_together_in_one_file_are_grouped() -> None:
    paths = ["a", "a", "b", "a", "b", "a"]
    spans = [(0, 10), (20, 10), (0, 5), (100_000, 10), (6, 4), (40, 10)]
    assert coalesce(paths, spans, gap=64) == [[0, 1, 5], [2, 4], [3]]
    assert coalesce(paths, spans, gap=64, most=30) == [[0, 1], [2, 4], [3], [5]]
    assert coalesce(["a"], [(5, 0)]) == [[0]]
    assert sorted(i for g in coalesce(paths, spans) for i in g) == list(range(len(paths)))


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"".join(s + b"\0" * 200 for s in SAMPLES))
    return path


def entries(path: str) -> list[tuple[str, int, int]]:
    return [(path, i * STRIDE, 1000) for i in range(20)]


def test_a_batch_of_neighbours_is_one_read_of_a_local_file(shard: Path) -> None:
    calls: list[str] = []

    def read(path: str) -> bytes:
        calls.append(path)
        return Path(path).read_bytes()

    with Loader(
        entries(str(shard)), batch_size=10, decode=None, shuffle=False, read=read, loader_process=False
    ) as ld:
        batches = list(ld)
    assert [b for batch in batches for b in batch] == SAMPLES
    assert len(calls) == 2  # one per batch, not one per sample


def test_a_range_past_the_end_fails_alone(shard: Path) -> None:
    """The group's one read fails (a range past the file's end): each range is then read on
    its own, so only that sample fails, with its own error."""
    bad = [*entries(str(shard))[:9], (str(shard), 19 * STRIDE + 500, 1000)]
    with Loader(
        FileDataset(bad), batch_size=10, decode=None, shuffle=False, on_error="skip", loader_process=False
    ) as ld:
        (batch,) = list(ld)
        stats = ld.stats
    assert list(batch) == SAMPLES[:9]
    assert stats.failures == 1


@pytest.fixture
def server(shard: Path) -> Iterator[str]:
    pytest.importorskip("aiohttp")
    from servers import start_file_server

    srv = start_file_server(shard.parent)
    try:
        yield srv.url
    finally:
        srv.stop()


def test_a_batch_of_neighbours_is_one_request(server: str) -> None:
    from servers import control, server_requests

    control(server)
    url = f"{server}/shard.bin"
    with Loader(entries(url), batch_size=10, decode=None, shuffle=False, loader_process=False) as ld:
        batches = list(ld)
    assert [b for batch in batches for b in batch] == SAMPLES
    gets = {k: v for k, v in server_requests(server).items() if k.startswith("GET ")}
    assert gets == {"GET /shard.bin": 2}

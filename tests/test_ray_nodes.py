"""``decode_on="ray"`` on a cluster of several nodes (``ray.cluster_utils.Cluster``: a head
with no CPU and two worker nodes of one CPU each, all on this machine), one of which is
removed mid-epoch: its tasks fail (``NodeDiedError``/``WorkerCrashedError``, or their
answers are lost) and are sent again to the node left, and every batch arrives, equal to
the expected ones. A module of its own: a process connects to one cluster at a time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from frontends import Driver
from helpers import decode_number, flatten

from aioloader import Loader

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from raykit import (  # noqa: E402 - after the skip: it imports ray
    cluster_cpus_free,  # noqa: F401 - autouse fixture
    wait_cpus_busy,
)


class Cluster:
    """The test's cluster: its head and two worker nodes."""

    def __init__(self) -> None:
        self.cluster = cluster_utils.Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={"num_cpus": 0, "include_dashboard": False},
        )
        self.workers = [self.cluster.add_node(num_cpus=1) for _ in range(2)]
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_node_removed_mid_epoch_loses_and_duplicates_nothing(
    frontend: Driver, cluster: Cluster, numbered: list[str], tmp_path: Path
) -> None:
    """After the first batch, tasks of the next batches are held on both worker nodes (the
    gate); one node is removed; then the gate opens. The tasks that died with the node are
    sent again to the node left: the epoch equals the local decode's, batch for batch, and
    the last tasks ran on the node that survived."""
    open_file = str(tmp_path / "open")
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 5}
    with Loader(numbered, decode=decode_number, loader_process=False, num_workers=1, **kw) as local:
        want = [flatten([b]) for b in local]
    # One task decoding at once, two in flight: the next batch's two tasks are sent once
    # the first batch's are answered (Ray need not start queued tasks in the order they were
    # sent), and then run one on each node (one CPU each).
    decode = PassFirst(set(want[0]), open_file)
    loader = Loader(numbered, decode=decode, decode_on="ray", num_workers=1, **kw)
    with frontend.opened(loader):
        it = frontend.iter(loader)
        got = [flatten([frontend.next(it)])]
        assert wait_cpus_busy(2) == 2  # a task held on each worker node
        cluster.cluster.remove_node(cluster.workers.pop())
        Path(open_file).touch()
        got += [flatten([b]) for b in frontend.rest(it)]
        stats = loader.stats
    assert got == want
    assert stats.cluster is not None and stats.cluster.samples >= 37
    # The removed node is replaced, for the next test, by a fresh one.
    cluster.workers.append(cluster.cluster.add_node(num_cpus=1))
    cluster.cluster.wait_for_nodes()


class PassFirst:
    """Decode numbered files; the samples of ``first`` at once, every other one only once
    the file ``open_file`` exists (a hang guard of 60 s)."""

    def __init__(self, first: set[int], open_file: str) -> None:
        self.first = first
        self.open_file = open_file

    def __call__(self, data: bytes) -> np.ndarray:
        value = decode_number(data)
        if int(value[0]) not in self.first:
            deadline = time.monotonic() + 60
            while not Path(self.open_file).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return value

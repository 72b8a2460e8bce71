"""What the ``decode_on="ray"`` test modules share (test_ray.py, test_ray_faults.py): one
Ray instance on this machine per module, and the check that a closed loader leaves no task
of its own on the cluster's CPUs. A module takes the fixtures by importing them::

    from raykit import cluster_cpus_free, ray_instance  # noqa: F401 - autouse fixtures

Import it only after ``pytest.importorskip("ray")``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from aioloader import Loader

#: The module's cluster: two CPUs, the machine's (the suite runs on two cores).
CPUS = 2


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    """One Ray instance for the module (starting one takes seconds), shut down at its end:
    a process connects to one cluster at a time (test_ray_nodes.py makes its own), and
    test_ray_connect.py needs none running."""
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def wait_cpus_free(seconds: float = 10.0) -> float:
    """The cluster's CPUs still in use after up to ``seconds`` (0.0: all free). It waits
    since a cancelled task frees its CPU only once Ray has interrupted it, and the figures
    Ray reports lag a little."""
    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + seconds
    while True:
        busy = total - ray.available_resources().get("CPU", 0.0)
        if busy == 0 or time.monotonic() > deadline:
            return float(busy)
        time.sleep(0.1)


def wait_cpus_busy(n: float, seconds: float = 10.0) -> float:
    """The cluster's CPUs in use, once ``n`` are (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        busy = ray.cluster_resources().get("CPU", 0.0) - ray.available_resources().get("CPU", 0.0)
        if busy >= n or time.monotonic() > deadline:
            return float(busy)
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def cluster_cpus_free() -> Iterator[None]:
    """After each test (its loaders closed), no task of its loaders still holds a cluster
    CPU: close() cancels what is in flight, and a task left running would show here."""
    yield
    busy = wait_cpus_free()
    assert busy == 0, f"{busy} CPU(s) of the cluster still busy after the test's loaders closed"


def ray_loader(dataset: Any, **kw: Any) -> Loader:
    return Loader(dataset, decode_on="ray", **kw)


def local_loader(dataset: Any, **kw: Any) -> Loader:
    """The reference: the local decode, in-process with one worker (quick to start)."""
    return Loader(dataset, loader_process=False, num_workers=1, **kw)

"""Shared fixtures: real files on disk, and a check that no test leaks a thread, a child
process, a file descriptor, a shared-memory slab or a mapping of one."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import pytest
import torch
from frontends import FRONTENDS, Driver, make_driver
from helpers import (
    RuntimeWatch,
    is_ray_fd,
    is_ray_thread,
    new_shm_entries,
    process_tree,
    ray_connected,
    ray_processes,
    shared_helper_pids,
    shm_entries,
    slab_holdings,
    slab_mappings,
    write_numbered_files,
)

from aioloader.decode.pool import mp_context
from aioloader.procs import zygote
from aioloader.synthetic import make_image_folder


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.cuda``: the test needs a CUDA GPU and is skipped without one."""
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="session", autouse=True)
def _process_wide_helpers() -> None:
    """Start what lives for the whole process by design before the leak checks take their
    first snapshot: the shared fork server, the resource tracker, and libuv's global
    signal pipe (made by the first uvloop loop of a process)."""
    zygote.context()  # the first loader would fork it: do it before any test's snapshot
    if mp_context().get_start_method() == "forkserver":
        forkserver.ensure_running()
    resource_tracker.ensure_running()
    if torch.cuda.is_available():  # the CUDA context's own fds, made once per process
        torch.zeros(1, device="cuda")
        torch.empty(1, pin_memory=True)
        torch.cuda.Event().record(torch.cuda.Stream())
        torch.cuda.synchronize()
    try:
        import uvloop
    except ImportError:
        return
    uvloop.new_event_loop().close()


def _fds() -> set[str]:
    """This process's descriptors, less Ray's own while it is connected (helpers.is_ray_fd)."""
    ray = ray_connected()
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the fd listdir itself used
        if not (ray and is_ray_fd(link)):
            out.add(f"{fd}->{link}")
    return out


def _mappings() -> set[str]:
    """Slabs mapped in this process, whoever made them (a loader process's, too): once a
    test's batches are garbage and its loaders closed, none may be left, since a memfd slab
    lives as long as any mapping of it."""
    return {name for _, _, name in slab_mappings()}


def _threads() -> set[str]:
    """This process's threads, less Ray's own while it is connected (helpers.is_ray_thread)."""
    ray = ray_connected()
    return {f"{t.name}#{t.ident}" for t in threading.enumerate() if not (ray and is_ray_thread(t))}


@dataclass(frozen=True)
class _Snapshot:
    """What the leak check compares: this process's threads, descriptors and slab
    mappings; its process tree (every descendant, the long-lived zygote and fork servers
    included) and the slab descriptors and mappings the tree's processes hold; and
    aioloader's entries in /dev/shm (slabs and semaphores, anyone's: see
    ``helpers.new_shm_entries``)."""

    threads: set[str]
    tree: set[int]
    fds: set[str]
    mappings: set[str]
    held: set[str]
    shm: set[str]

    @classmethod
    def take(cls) -> _Snapshot:
        tree = process_tree()
        return cls(_threads(), tree, _fds(), _mappings(), slab_holdings(tree), set(shm_entries()))


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves behind, in this process, a thread, a file descriptor or a
    mapping of a slab; a descendant process (not counting the process-wide helpers); a slab
    descriptor or mapping in any process of the tree (the zygote, a fork server, a worker,
    a loader process); or an aioloader segment or semaphore in /dev/shm made by this
    process, a descendant, or a process gone since (a loader process that exited). While
    this process is connected to Ray, Ray's own processes, threads and descriptors are
    not counted (helpers.ray_processes, is_ray_thread, is_ray_fd)."""
    before = _Snapshot.take()
    yield
    if request.node.get_closest_marker("allow_leaks"):
        return
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        now = _Snapshot.take()
        threads = now.threads - before.threads
        procs = now.tree - shared_helper_pids() - before.tree
        if ray_connected():  # Ray starts its workers and agents when it likes (helpers.py)
            procs -= ray_processes(procs)
        fds = {fd for fd in now.fds - before.fds if "/dev/pts" not in fd}
        mapped = now.mappings - before.mappings
        held = now.held - before.held
        # Made here, by a descendant, or by a process gone since (a loader process); not
        # another run's (a benchmark or a colleague's tests on the same machine).
        segments = new_shm_entries(before.shm, {os.getpid()} | now.tree | before.tree)
        if not (threads or procs or fds or segments or mapped or held) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if threads:
        problems.append(f"threads: {sorted(threads)}")
    if procs:
        problems.append(f"child processes: {sorted(procs)}")
    if fds:
        problems.append(f"file descriptors: {sorted(fds)}")
    if segments:
        problems.append(f"shared-memory segments or semaphores in /dev/shm: {sorted(segments)}")
    if mapped:
        problems.append(f"shared-memory slabs still mapped: {sorted(mapped)}")
    if held:
        problems.append(f"slabs held or mapped by the process tree: {sorted(held)}")
    if problems:
        pytest.fail("leaked after the test: " + "; ".join(problems))


@pytest.fixture
def runtimes(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[RuntimeWatch]:
    """Every runtime the test's loaders start, recorded; a fixture that runs a test
    ``[thread]`` or ``[process]`` says which with ``runtimes.expect(process)``, and the test
    fails (see ``pytest_runtest_call`` below) when a loader ran elsewhere: a ``[process]``
    loader that fell back to in-process (no zygote), or the runtime not the one asked for."""
    watch = RuntimeWatch()
    watch.install(monkeypatch)
    request.node.stash[_RUNTIMES] = watch
    try:
        yield watch
    finally:
        watch.uninstall()


_RUNTIMES = pytest.StashKey[RuntimeWatch]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test whose loaders ran in another runtime than its id says fails (not an error at
    teardown): the check runs once its body returned."""
    result = yield
    watch = item.stash.get(_RUNTIMES, None)
    if watch is not None and (problems := watch.problems()):
        pytest.fail("not the runtime this test stands for: " + "; ".join(problems))
    return result


@pytest.fixture(scope="session")
def numbered(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """37 real files whose content is their number (37: prime, so no batch size divides it)."""
    return write_numbered_files(tmp_path_factory.mktemp("numbered"), 37)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ImageFolder of real JPEGs: 3 classes, 30 images of 96x72."""
    root = tmp_path_factory.mktemp("images")
    return make_image_folder(root, num_images=30, num_classes=3, size=(96, 72))


@pytest.fixture(params=FRONTENDS)
def frontend(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """The test once through ``for``/``with`` ("sync") and once through ``async for``/``async
    with`` on an event loop that lives for the test ("async"); see frontends.py."""
    drive = make_driver(request.param)
    try:
        yield drive
    finally:
        drive.finish()


# -- real servers on loopback (remote storage) ----------------------------------------------

BUCKET = "aioloader-test"
S3_KEYS = {"key": "testing-key-id", "secret": "testing-secret-do-not-show"}


@pytest.fixture(scope="session")
def moto_s3(numbered: list[str]) -> Iterator[dict[str, object]]:
    """moto's S3 server on 127.0.0.1 with ``numbered``'s files under
    ``s3://aioloader-test/numbered/``; yields the loader's ``storage_options``."""
    pytest.importorskip("s3fs")
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from servers import s3_client, start_moto

    server = start_moto()
    try:
        options: dict[str, object] = {
            **S3_KEYS,
            "endpoint_url": server.url,
            "client_kwargs": {"region_name": "us-east-1"},
        }
        client = s3_client(options)
        client.create_bucket(Bucket=BUCKET)
        for p in numbered:
            client.upload_file(p, BUCKET, f"numbered/{os.path.basename(p)}")
        yield options
    finally:
        server.stop()


@pytest.fixture(scope="session")
def signed_s3(numbered: list[str]) -> Iterator[dict[str, Any]]:
    """moto's S3 server checking every request's signature (``start_moto(check_credentials=
    True)``), with ``numbered``'s files under ``s3://aioloader-test/numbered/`` and one user
    who may read all but one of them (``servers.moto_reader``): ``options`` (that user's
    ``storage_options``), ``env`` (the same as ``AWS_*`` variables), ``url`` (the endpoint),
    ``denied`` (the URL of the object the user may not read: AccessDenied, 403) and
    ``secret`` (the user's, to look for in what the loader shows)."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from servers import moto_reader, start_moto

    server = start_moto(check_credentials=True)
    try:
        objects = {f"numbered/{os.path.basename(p)}": p for p in numbered}
        denied = f"numbered/{os.path.basename(numbered[5])}"
        key, secret = moto_reader(server.url, BUCKET, objects, denied=(denied,))
        yield {
            "options": {
                "key": key,
                "secret": secret,
                "endpoint_url": server.url,
                "client_kwargs": {"region_name": "us-east-1"},
            },
            "env": {
                "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_ENDPOINT_URL": server.url,
                "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true",
            },
            "url": server.url,
            "denied": f"s3://{BUCKET}/{denied}",
            "secret": secret,
        }
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _s3_proxy(moto_s3: dict[str, object]) -> Iterator[str]:
    pytest.importorskip("aiohttp")
    from servers import start_proxy

    server = start_proxy(str(moto_s3["endpoint_url"]))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def s3_proxy(_s3_proxy: str, moto_s3: dict[str, object]) -> Iterator[dict[str, object]]:
    """``moto_s3`` behind the proxy of servers.py: its ``storage_options``, with the proxy's
    URL as ``proxy`` (faults and latency set with ``servers.control``; none unless the test
    sets them)."""
    from servers import CONTROL_DEFAULTS, control

    control(_s3_proxy, **CONTROL_DEFAULTS)
    yield {**moto_s3, "endpoint_url": _s3_proxy, "proxy": _s3_proxy}
    control(_s3_proxy, **CONTROL_DEFAULTS)


@pytest.fixture(scope="session")
def _file_server(numbered: list[str]) -> Iterator[str]:
    pytest.importorskip("aiohttp")
    from servers import start_file_server

    server = start_file_server(Path(numbered[0]).parent)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def http_files(_file_server: str) -> Iterator[str]:
    """The aiohttp file server serving ``numbered``'s folder at this URL (no latency, no
    faults unless the test sets them with ``servers.control``)."""
    from servers import CONTROL_DEFAULTS, control

    control(_file_server, **CONTROL_DEFAULTS)
    yield _file_server
    control(_file_server, **CONTROL_DEFAULTS)

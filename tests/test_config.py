"""aioloader.config.LoaderConfig.create, directly and through Loader(...) construction.

Every argument error names the argument and shows the value.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
from typing import Any

import pytest
import torch
from helpers import decode_number, make_config

import aioloader
from aioloader import FileDataset, ImageDecoder
from aioloader.config import AUTO_IO_START, LoaderConfig, resolve_device, usable_cpus

#: What the tests here set apart from ``helpers.make_config``'s small settings.
DEFAULTS: dict[str, Any] = {"shuffle": False, "seed": 0, "io_concurrency": 8}

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def create(**overrides: Any) -> LoaderConfig:
    config: LoaderConfig = make_config(**{**DEFAULTS, **overrides})
    return config


def loader(**overrides: Any) -> aioloader.Loader:
    return aioloader.Loader(["a.jpg", "b.jpg", "c.jpg"], **overrides)


# (overrides, exception type, exact message)
EXACT_ERRORS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"batch_size": 0}, ValueError, "batch_size=0 must be a positive integer"),
    ({"batch_size": -2}, ValueError, "batch_size=-2 must be a positive integer"),
    ({"batch_size": True}, ValueError, "batch_size=True must be a positive integer"),
    ({"batch_size": 2.0}, ValueError, "batch_size=2.0 must be a positive integer"),
    ({"batch_size": "8"}, ValueError, "batch_size='8' must be a positive integer"),
    ({"batch_size": None}, ValueError, "batch_size=None must be a positive integer"),
    ({"num_workers": 0}, ValueError, "num_workers=0 must be a positive integer"),
    ({"num_workers": False}, ValueError, "num_workers=False must be a positive integer"),
    ({"io_concurrency": 0}, ValueError, "io_concurrency=0 must be a positive integer"),
    ({"io_concurrency": True}, ValueError, "io_concurrency=True must be a positive integer"),
    ({"io_concurrency": "fast"}, ValueError, "io_concurrency='fast' must be a positive integer or 'auto'"),
    ({"num_workers": "all"}, ValueError, "num_workers='all' must be a positive integer, 'auto' or None"),
    ({"prefetch": 0}, ValueError, "prefetch=0 must be a positive integer"),
    ({"prefetch": 1.5}, ValueError, "prefetch=1.5 must be a positive integer"),
    ({"seed": -1}, ValueError, "seed=-1 must be a non-negative integer"),
    ({"seed": True}, ValueError, "seed=True must be a non-negative integer"),
    ({"seed": 1.0}, ValueError, "seed=1.0 must be a non-negative integer"),
    ({"shuffle": 1}, TypeError, "shuffle=1 must be True or False"),
    ({"shuffle": "yes"}, TypeError, "shuffle='yes' must be True or False"),
    ({"drop_last": None}, TypeError, "drop_last=None must be True or False"),
    ({"ordered": 0}, TypeError, "ordered=0 must be True or False"),
    ({"zero_copy": "no"}, TypeError, "zero_copy='no' must be True or False"),
    ({"loader_process": "yes"}, ValueError, "loader_process='yes' must be 'auto', True or False"),
    ({"loader_process": 1}, ValueError, "loader_process=1 must be 'auto', True or False"),
    ({"loader_process": None}, ValueError, "loader_process=None must be 'auto', True or False"),
    ({"loader_process": "Auto"}, ValueError, "loader_process='Auto' must be 'auto', True or False"),
    ({"read_retries": -1}, ValueError, "read_retries=-1 must be a non-negative integer"),
    ({"read_retries": True}, ValueError, "read_retries=True must be a non-negative integer"),
    ({"max_worker_restarts": -1}, ValueError, "max_worker_restarts=-1 must be a non-negative integer"),
    ({"max_worker_restarts": 1.0}, ValueError, "max_worker_restarts=1.0 must be a non-negative integer"),
    ({"sample_timeout": 0}, ValueError, "sample_timeout=0 must be a positive number of seconds or None"),
    (
        {"sample_timeout": -1.5},
        ValueError,
        "sample_timeout=-1.5 must be a positive number of seconds or None",
    ),
    (
        {"sample_timeout": True},
        ValueError,
        "sample_timeout=True must be a positive number of seconds or None",
    ),
    ({"sample_timeout": "5"}, ValueError, "sample_timeout='5' must be a positive number of seconds or None"),
    ({"decode": 5}, TypeError, "decode=5 must be callable (bytes -> sample) or None"),
    ({"collate": "stack"}, TypeError, "collate='stack' must be callable (list of samples -> batch)"),
    ({"read": 3}, TypeError, "read=3 must be callable (path -> bytes) or None"),
    ({"device": 0}, TypeError, "device=0 must be None, a string or a torch.device"),
    ({"pin_memory": "yes"}, TypeError, "pin_memory='yes' must be True, False or None"),
    ({"pin_memory": 1}, TypeError, "pin_memory=1 must be True, False or None"),
    ({"on_error": "ignore"}, ValueError, "on_error='ignore' must be 'raise' or 'skip'"),
    ({"on_error": None}, ValueError, "on_error=None must be 'raise' or 'skip'"),
    ({"max_failures": 3}, ValueError, "max_failures=3 needs on_error='skip'"),
    ({"max_failures": 0.1, "on_error": "raise"}, ValueError, "max_failures=0.1 needs on_error='skip'"),
    ({"max_failures": -1, "on_error": "skip"}, ValueError, "max_failures=-1 must be >= 0"),
    (
        {"max_failures": 1.5, "on_error": "skip"},
        ValueError,
        "max_failures=1.5 as a fraction must be in [0, 1]",
    ),
    (
        {"max_failures": -0.1, "on_error": "skip"},
        ValueError,
        "max_failures=-0.1 as a fraction must be in [0, 1]",
    ),
    (
        {"max_failures": "3", "on_error": "skip"},
        TypeError,
        "max_failures='3' must be an int count or a float fraction",
    ),
    (
        {"max_failures": True, "on_error": "skip"},
        TypeError,
        "max_failures=True must be an int count or a float fraction",
    ),
]


def test_every_error_message_is_exact_via_create() -> None:
    for overrides, exc_type, message in EXACT_ERRORS:
        with pytest.raises(exc_type) as info:
            create(**overrides)
        assert str(info.value) == message, overrides


def test_every_error_message_is_exact_via_loader() -> None:
    for overrides, exc_type, message in EXACT_ERRORS:
        with pytest.raises(exc_type) as info:
            loader(**overrides)
        assert str(info.value) == message, overrides


def test_batch_size_zero_exact_message() -> None:
    with pytest.raises(ValueError, match=r"^batch_size=0 must be a positive integer$"):
        aioloader.Loader(["a.jpg"], batch_size=0)


def test_valid_config_values() -> None:
    cfg = create(batch_size=7, seed=123, shuffle=True, drop_last=True, ordered=False, prefetch=5)
    assert cfg.sampling.batch_size == 7
    assert cfg.sampling.seed == 123
    assert cfg.sampling.shuffle is True and cfg.sampling.drop_last is True and cfg.delivery.ordered is False
    assert cfg.delivery.prefetch == 5
    assert cfg.reading.io_start == 8
    assert cfg.delivery.device == torch.device("cpu")
    assert cfg.delivery.zero_copy is True
    assert (
        cfg.reading.read_retries == 2
        and cfg.decoding.max_worker_restarts == 3
        and cfg.failures.sample_timeout is None
    )
    other = create(read_retries=0, max_worker_restarts=0, sample_timeout=2)
    assert other.reading.read_retries == 0 and other.decoding.max_worker_restarts == 0
    assert other.failures.sample_timeout == 2.0 and type(other.failures.sample_timeout) is float
    with pytest.raises(AttributeError):
        cfg.sampling.batch_size = 8  # type: ignore[misc]


def test_max_failures_accepted_with_skip() -> None:
    for value in (0, 5, 0.0, 0.25, 1.0):
        cfg = create(on_error="skip", max_failures=value)
        assert cfg.failures.max_failures == value
        assert type(cfg.failures.max_failures) is type(value)
    assert create(on_error="skip").failures.max_failures is None


def test_unsupported_device_rejected() -> None:
    for device in ("tpu", "meta", "mps", "not a device", "cpu:x", ""):
        with pytest.raises(ValueError, match=re.escape(f"device={device!r}")):
            create(device=device)
    with pytest.raises(ValueError, match=re.escape("device='tpu'")):
        loader(device="tpu")


@NO_CUDA
def test_cuda_without_cuda_rejected() -> None:
    for device in ("cuda", "cuda:0", "cuda:3", torch.device("cuda")):
        with pytest.raises(ValueError, match="CUDA") as info:
            create(device=device)
        assert f"device={device!r}" in str(info.value)
        with pytest.raises(ValueError, match="CUDA"):
            loader(device=device)


@pytest.mark.cuda
def test_cuda_device_resolves_with_index_when_the_loader_starts(numbered: list[str]) -> None:
    """``"cuda"`` keeps no index while the loader is made (this rank's GPU, whenever the
    loader was made: tests/test_node.py); it has one from the start."""
    cfg = create(device="cuda")
    assert cfg.delivery.device == torch.device("cuda")
    with aioloader.Loader(numbered, batch_size=4, decode=decode_number, device="cuda") as started:
        assert started.device == torch.device("cuda", torch.cuda.current_device())
        assert next(iter(started)).device == started.device
    assert cfg.delivery.pin_memory is True
    assert create(device="cuda", pin_memory=False).delivery.pin_memory is False
    with pytest.raises(ValueError, match=r"CUDA device\(s\)"):
        create(device=f"cuda:{torch.cuda.device_count()}")


def test_cpu_device_never_pins() -> None:
    for device in (None, "cpu", "cpu:0", torch.device("cpu")):
        for pin in (None, True, False):
            cfg = create(device=device, pin_memory=pin)
            assert cfg.delivery.device.type == "cpu"
            assert cfg.delivery.pin_memory is False, (device, pin)
    assert loader(pin_memory=True).config.delivery.pin_memory is False


def test_resolve_device() -> None:
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")).type == "cpu"


def test_num_workers_none_is_usable_cpus() -> None:
    assert create(num_workers=None).build.workers == usable_cpus()
    assert create(num_workers=3).build.workers == 3


def test_usable_cpus_lie_within_the_affinity() -> None:
    """Whatever CPU quota this machine's cgroup has: never more than the CPUs this process
    may run on, never fewer than one (the quota itself: test_cpus.py, in real cgroups)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert 1 <= usable_cpus() <= affinity


def test_loky_max_cpu_count_lowers_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/guides/environments.md ("Containers and CPU quotas"): ``LOKY_MAX_CPU_COUNT``,
    when set, lowers the count, and the default ``num_workers`` with it."""
    usable = usable_cpus()
    if usable < 2:
        pytest.skip("one usable CPU: there is nothing to lower")
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", str(usable - 1))
    assert usable_cpus() == usable - 1
    assert create(num_workers=None).build.workers == usable - 1
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", str(usable + 8))  # it only lowers
    assert usable_cpus() == usable


def test_loader_defaults() -> None:
    ld = aioloader.Loader(["a.jpg"])
    cfg = ld.config
    assert cfg.sampling.batch_size == 256
    assert cfg.sampling.shuffle is True
    assert cfg.sampling.seed == 0
    assert cfg.sampling.drop_last is False
    assert cfg.delivery.ordered is True
    assert cfg.failures.on_error == "raise"
    assert cfg.failures.max_failures is None
    assert cfg.delivery.pin_memory is False
    assert cfg.delivery.device == torch.device("cpu")
    assert cfg.build.workers == usable_cpus()
    assert isinstance(cfg.decoding.decode, ImageDecoder)
    assert cfg.decoding.decode.output_shape == (3, 224, 224)
    assert cfg.delivery.loader_process == "auto" and cfg.build.start_in == "process" and ld.runtime is None
    ld.close()


def test_loader_decode_none_and_custom_decode() -> None:
    assert loader(decode=None).config.decoding.decode is None
    dec = ImageDecoder(32)
    assert loader(decode=dec).config.decoding.decode is dec


def test_loader_rejects_non_sequence_dataset() -> None:
    for dataset in ("a.jpg", b"a.jpg", 5, None, {"a.jpg"}):
        with pytest.raises(TypeError) as info:
            aioloader.Loader(dataset)  # type: ignore[arg-type]
        expected = f"dataset must be a FileDataset or a sequence of paths, got {type(dataset).__name__}"
        assert str(info.value) == expected


def test_loader_empty_dataset_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        aioloader.Loader([])


def test_loader_len_before_start() -> None:
    ds = FileDataset([f"{i}.jpg" for i in range(10)])
    assert len(aioloader.Loader(ds, batch_size=4)) == 3
    assert len(aioloader.Loader(ds, batch_size=4, drop_last=True)) == 2
    assert len(aioloader.Loader(ds, batch_size=10, drop_last=True)) == 1
    assert len(aioloader.Loader(ds, batch_size=11, drop_last=True)) == 0


def test_constructing_a_loader_starts_nothing() -> None:
    threads_before = set(threading.enumerate())
    children_before = set(multiprocessing.active_children())
    loaders = [
        aioloader.Loader(["a.jpg", "b.jpg"]),
        aioloader.Loader(["a.jpg"], decode=None, num_workers=2),
        aioloader.Loader(FileDataset(["a.jpg"], labels=[0]), batch_size=1, on_error="skip", max_failures=0.5),
    ]
    for ld in loaders:
        assert ld.state.value == "idle"
        assert len(ld) >= 1
        assert ld.stats.batches == 0
    assert set(threading.enumerate()) == threads_before
    assert set(multiprocessing.active_children()) == children_before
    # Closing a loader that never started starts nothing either.
    for ld in loaders:
        ld.close()
        ld.close()  # idempotent
        assert ld.state.value == "closed"
    assert set(threading.enumerate()) == threads_before
    assert set(multiprocessing.active_children()) == children_before


def test_invalid_arguments_start_nothing() -> None:
    threads_before = set(threading.enumerate())
    with pytest.raises(ValueError):
        aioloader.Loader(["a.jpg"], prefetch=0)
    assert set(threading.enumerate()) == threads_before


def test_auto_settings() -> None:
    cfg = create(io_concurrency="auto", num_workers="auto")
    assert cfg.reading.io_auto and cfg.decoding.workers_auto and cfg.autotuned
    assert cfg.reading.io_start == AUTO_IO_START  # where the tuner starts
    assert cfg.build.workers == usable_cpus()  # processes started; the tuner picks how many decode
    fixed = create(io_concurrency=8, num_workers=2)
    assert not (fixed.reading.io_auto or fixed.decoding.workers_auto or fixed.autotuned)
    loader = aioloader.Loader(["a.jpg"])
    assert (
        loader.config.reading.io_auto and not loader.config.decoding.workers_auto
    )  # io "auto" is the default


def test_loader_process_auto_true_or_false() -> None:
    """``"auto"`` (the default) and True start in a loader process, False in-process; only
    ``"auto"`` may fall back silently. ``loader_process`` stays as given; ``start_in`` is
    the choice settled. Where obstore may read follows (storage_backend)."""
    settled = {
        value: (c.delivery.loader_process, c.build.start_in, c.build.storage_backend)
        for value in ("auto", True, False)
        for c in [create(loader_process=value, decode=decode_number)]
    }
    assert settled == {
        "auto": ("auto", "process", "auto"),
        True: (True, "process", "auto"),
        False: (False, "thread", "fsspec"),
    }
    # Without a decode, "auto" loads in-process (nothing to take off the trainer's GIL but
    # the reads; a loader process would copy the bytes once more), unless obstore is asked.
    assert create(loader_process="auto", decode=None).build.start_in == "thread"
    assert create(loader_process=True, decode=None).build.start_in == "process"
    # Slow storage keeps it: URLs, or a read of the user's (RESULTS §24: reads cost no CPU there).
    assert create(loader_process="auto", decode=None, remote=True).build.start_in == "process"
    assert create(loader_process="auto", decode=None, read=len).build.start_in == "process"
    obstore = create(loader_process="auto", decode=None, storage_backend="obstore")
    assert (obstore.build.start_in, obstore.build.storage_backend) == ("process", "obstore")
    assert create(loader_process="auto", storage_backend="obstore").build.storage_backend == "obstore"
    with pytest.raises(ValueError, match=r"^storage_backend='obstore' needs a loader process"):
        create(loader_process=False, storage_backend="obstore")


def test_auto_with_a_callable_that_cannot_be_sent_settles_in_process() -> None:
    """``read`` and ``collate`` run in the loader process, so they must be sent there: under
    ``"auto"`` one that cannot be loads in-process instead; True refuses it, naming it.
    obstore reads only in a loader process: then the callable is the error."""
    lock = threading.Lock()

    def read(path: str) -> bytes:
        with lock:
            return b""

    for name in ("read", "collate"):
        refused = rf"^{name}=<function .*read.*> cannot be sent to the loader process"
        cfg = create(**{name: read, "decode": decode_number})
        assert (cfg.delivery.loader_process, cfg.build.start_in) == ("auto", "thread")
        assert cfg.build.storage_backend == "fsspec" and name not in cfg.build.sent
        with pytest.raises(ValueError, match=refused):
            create(**{name: read, "loader_process": True, "decode": decode_number})
        with pytest.raises(ValueError, match=refused):
            create(**{name: read, "storage_backend": "obstore", "decode": decode_number})
    assert create(read=len, collate=list, decode=decode_number).build.sent.keys() == {
        "decode",
        "read",
        "collate",
    }


def flat_state(config: LoaderConfig) -> dict[str, Any]:
    """``config`` as a config was pickled before the parts: one flat object, its workers
    settled into ``num_workers`` and ``io_concurrency`` with ``workers_auto``/``io_auto``."""
    state: dict[str, Any] = {}
    for part in (config.sampling, config.reading, config.decoding, config.delivery, config.failures):
        state.update(vars(part))
    state.update(vars(config.build))
    state.update(
        num_workers=state.pop("workers"),
        io_concurrency=config.reading.io_start,
        io_auto=config.reading.io_auto,
        workers_auto=config.decoding.workers_auto,
        cache=config.cache,
        decode=None,
        sent={},
    )
    return state


def test_a_config_pickled_before_the_parts_loads_into_them() -> None:
    """A flat config (before the parts) loads with each setting in its part, as given, and
    what was settled in the build: ``"auto"`` back where ``io_auto``/``workers_auto`` said so."""
    for auto in (False, True):
        made = create(io_concurrency="auto" if auto else 8, num_workers="auto" if auto else 2)
        old = LoaderConfig.__new__(LoaderConfig)
        old.__setstate__(flat_state(made))
        assert old.reading.io_concurrency == made.reading.io_concurrency
        assert old.decoding.num_workers == made.decoding.num_workers
        assert old.build.workers == made.build.workers and old.sampling == made.sampling
        assert old.delivery == made.delivery and old.failures == made.failures


def test_a_config_pickled_with_the_old_names_loads_with_one_name_per_setting() -> None:
    """Before ``start_in``, ``loader_process`` held the settled choice (a bool) and
    ``process_auto`` whether ``"auto"`` was given: a config pickled then loads with
    ``loader_process`` as given and ``start_in`` as settled (``tests/data/before_wings.pkl``,
    older still, has no ``process_auto``: test_layout.py)."""
    for given, settled, auto in (
        ("auto", "process", True),
        ("auto", "thread", True),
        (True, "process", False),
    ):
        state = flat_state(create())
        del state["start_in"]
        state.update(loader_process=settled == "process", process_auto=auto)
        old = LoaderConfig.__new__(LoaderConfig)
        old.__setstate__(state)
        assert (old.delivery.loader_process, old.build.start_in) == (given, settled)
        assert "process_auto" not in vars(old)

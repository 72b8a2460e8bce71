"""A loader's settings: each part's own, and what building the loader decided from them.

``Loader(...)``'s keyword arguments belong to the parts that use them, each a small frozen
object that checks itself when made (the error names the argument and shows the value):

- sampling and shards, :class:`~aioloader.plan.settings.Sampling`: ``batch_size``,
  ``shuffle``, ``seed``, ``drop_last``, ``rank``, ``world_size``, ``pad_shards``;
- reading, :class:`~aioloader.read.settings.Reading`: ``io_concurrency``, ``read``,
  ``read_retries``, ``storage_options``, ``storage_backend``;
- decoding, :class:`~aioloader.decode.settings.Decoding`: ``decode``, ``num_workers``,
  ``decode_on``, ``max_worker_restarts``;
- delivery and device, :class:`~aioloader.engine.settings.Delivery`: ``collate``,
  ``prefetch``, ``ordered``, ``zero_copy``, ``device``, ``pin_memory``, ``loader_process``,
  ``progress``;
- failures, :class:`~aioloader.engine.settings.Failures`: ``on_error``, ``max_failures``,
  ``sample_timeout``;
- caching: ``cache``, a :class:`~aioloader.Cache` itself.

The cut follows who reads them: the plan reads only the sampling part, the reader only the
reading part, the decode stage and the pool only the decoding part (with the seed and the
timeout), the engine's assembly and the bridge only the delivery part, the failure policy
only its own.

:meth:`LoaderConfig.create` hands each part its own arguments, by the part's field names,
checks what only parts together can say (a device decode and the device, Ray and a loader
process, a cache's ``max_side``), then decides, once, what the settings leave to the machine
(:class:`Build`: the workers, where the pipeline starts, the callables pickled for other
processes). Nothing is replaced after that: a part is handed whole to whoever owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from aioloader.base import sendable
from aioloader.build import Build, Where, check_together, choose_runtime, decide, send_decode, usable_cpus
from aioloader.cache.settings import Cache
from aioloader.decode.ondevice import decodes_on_device
from aioloader.decode.settings import Decoding
from aioloader.engine.settings import Delivery, Failures, resolve_device
from aioloader.observe.bottleneck import Setup
from aioloader.observe.stats import Counters
from aioloader.plan.settings import Sampling, resolve_rank
from aioloader.read.settings import AUTO_IO_START, Reading
from aioloader.tune.tuner import Tuning

__all__ = [
    "AUTO_IO_START",
    "PARTS",
    "Build",
    "LoaderConfig",
    "Where",
    "choose_runtime",
    "resolve_device",
    "resolve_rank",
    "send_decode",
    "usable_cpus",
]

#: The parts whose fields are ``Loader``'s arguments (``cache`` is the one argument that is
#: a part by itself), in the order they are made and checked.
PARTS = (Sampling, Reading, Decoding, Delivery, Failures)


#: The part that holds each callable that may be sent to another process.
_SENT_IN = {"decode": "decoding", "read": "reading", "collate": "delivery"}


@dataclass(frozen=True)
class LoaderConfig:
    """Every setting of a :class:`~aioloader.Loader`, part by part (see the module
    docstring), and what :meth:`create` decided from them (``build``)."""

    sampling: Sampling = field(default_factory=Sampling)
    reading: Reading = field(default_factory=Reading)
    decoding: Decoding = field(default_factory=Decoding)
    delivery: Delivery = field(default_factory=Delivery)
    failures: Failures = field(default_factory=Failures)
    cache: Cache | None = None
    build: Build = field(default_factory=Build)

    def __getstate__(self) -> dict[str, Any]:
        # A config crosses to the loader process with its callables as the blobs made when
        # it was created: by value, so that process never needs the trainer's __main__.
        state = dict(self.__dict__)
        for name in self.build.sent:
            state[_SENT_IN[name]] = _with(state[_SENT_IN[name]], **{name: None})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "sampling" not in state:  # pickled before the parts: one flat object
            state = _from_flat(state)
        for name, blob in state["build"].sent.items():
            state[_SENT_IN[name]] = _with(state[_SENT_IN[name]], **{name: sendable.loads(blob, name)})
        self.__dict__.update(state)  # frozen: no setattr, and __init__ would check again

    @property
    def autotuned(self) -> bool:
        return self.reading.io_auto or self.decoding.workers_auto

    def setup(self, remote: bool) -> Setup:
        """What runs in a loader of these settings, for the verdict (``remote``: it reads URLs)."""
        decode = self.decoding.decode
        return Setup(
            decode=decode is not None,
            device=self.delivery.target.type,
            pin_memory=bool(self.delivery.pin_memory),
            bridge_decodes=decodes_on_device(decode),
            remote=remote,
        )

    def counters(self, remote: bool) -> Counters:
        """A loader's counters: its stage bounds, what runs, how the node's CPUs were divided."""
        b = self.build
        return Counters.for_loader(
            self.reading.io_start, b.workers, self.setup(remote), b.ranks_on_node, b.cpus_per_rank
        )

    def tuning(self) -> Tuning | None:
        """What the tuner moves (None without an ``"auto"`` setting)."""
        if not self.autotuned:
            return None
        b = self.build
        return Tuning(
            self.sampling.batch_size,
            b.workers,
            b.cpus_per_rank,
            self.reading.io_auto,
            self.decoding.workers_auto,
        )

    @classmethod
    def create(
        cls, given: Mapping[str, object], remote: bool = False, early: Callable[..., None] | None = None
    ) -> LoaderConfig:
        """The settings of ``Loader(**given)``, or a ``ValueError``/``TypeError`` for the first
        argument found wrong: each part checks its own, in :data:`PARTS` order, then
        :func:`check_together` the parts together, then the build is decided
        (:func:`decide`). ``remote``: whether the dataset's files are URLs; ``early(decode,
        read, collate)`` runs before the delivery part resolves the device (which may make
        CUDA's context: the zygote is made before, :func:`aioloader.procs.zygote.early`)."""
        unknown = set(given) - {f.name for part in PARTS for f in fields(part)} - {"cache"}
        if unknown:
            raise TypeError(f"Loader() got unexpected keyword arguments {sorted(unknown)}")
        made: dict[str, Any] = {}
        for part in PARTS:
            if part is Delivery and early is not None and _forks(made["decoding"], given):
                early(made["decoding"].decode, made["reading"].read, given.get("collate"))
            mine: dict[str, Any] = {f.name: given[f.name] for f in fields(part) if f.name in given}
            made[part.__name__.lower()] = part(**mine)
        cache = check_together(made["decoding"], made["delivery"], given.get("cache"))
        build = decide(made["reading"], made["decoding"], made["delivery"], remote)
        return cls(**made, cache=cache, build=build)


def _forks(decoding: Decoding, given: Mapping[str, object]) -> bool:
    """Whether a loader of these settings may fork helpers from a zygote: a local decode,
    or a loader process."""
    maybe_process = given.get("loader_process", Delivery.loader_process) is not False
    return not decoding.on_ray and (decoding.decode is not None or maybe_process)


def _with(part: Any, **values: object) -> Any:
    """A copy of the frozen ``part`` with ``values`` set, not checked again (a callable put
    back or taken out for pickling)."""
    copy = object.__new__(type(part))
    copy.__dict__.update(part.__dict__, **values)
    return copy


def _from_flat(state: dict[str, Any]) -> dict[str, Any]:
    """A config pickled before the parts (one flat object, its ``num_workers`` and
    ``io_concurrency`` settled with ``workers_auto``/``io_auto`` flags; older still,
    ``loader_process`` the settled choice and ``process_auto`` whether ``"auto"`` was given)
    as the parts and the build, none checked again."""
    if "start_in" not in state:
        state["start_in"] = "process" if state.get("loader_process") else "thread"
        state["loader_process"] = (
            "auto" if state.pop("process_auto", False) else bool(state.get("loader_process"))
        )
    build = _restored(Build, state, workers=state.get("num_workers", 1))
    if state.get("workers_auto"):
        state["num_workers"] = "auto"
    if state.get("io_auto"):
        state["io_concurrency"] = "auto"
    parts = {part.__name__.lower(): _restored(part, state) for part in PARTS}
    return {**parts, "cache": state.get("cache"), "build": build}


def _restored(cls: type, state: Mapping[str, Any], **extra: object) -> Any:
    values = {}
    for f in fields(cls):
        if f.name in extra:
            values[f.name] = extra[f.name]
        elif f.name in state:
            values[f.name] = state[f.name]
        else:
            values[f.name] = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
    return _with(object.__new__(cls), **values)

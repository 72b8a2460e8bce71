"""``Loader``: the public front-ends (``for``, ``async for``, ``with``, ``async with``) over the
one engine. It owns a lifecycle state and, once started, a runtime (:mod:`aioloader.run.runtime`).
Both iterators (:mod:`aioloader.run.cursor`) read the hand-off the bridging thread fills: the sync
one blocks on it, the async one awaits it on the caller's loop; neither runs pipeline logic."""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import torch

from aioloader.base.threads import in_thread
from aioloader.build import with_members
from aioloader.cache.settings import Cache
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset, StrPath
from aioloader.decode.settings import DecodeOn, Decoding
from aioloader.engine.settings import Delivery, Failures, LoaderProcess, OnError, Progress
from aioloader.errors import LoaderClosedError
from aioloader.observe.progressbar import make_bar
from aioloader.observe.stats import LoaderStats
from aioloader.plan.epochs import Epochs
from aioloader.plan.locality import Locality
from aioloader.plan.resume import check_state, make_state
from aioloader.plan.sampler import num_batches, shard_size
from aioloader.plan.settings import Sampling
from aioloader.procs import zygote
from aioloader.read.backends import StorageBackend
from aioloader.read.settings import Reading
from aioloader.read.urls import is_remote
from aioloader.run.cursor import CLOSED_MESSAGE, AsyncIter, Cursor, SyncIter
from aioloader.run.procruntime import ProcessRuntime
from aioloader.run.runtime import Runtime
from aioloader.run.start import settle_device, start_runtime
from aioloader.safety import sigterm

__all__ = ["CLOSED_MESSAGE", "Loader", "State"]


class State(enum.Enum):
    """``IDLE`` (constructed) -> ``STARTED`` (threads and workers up) -> ``CLOSED``."""

    IDLE = "idle"
    STARTED = "started"
    CLOSED = "closed"


class Loader:
    """Loads batches of files, read concurrently and decoded in worker processes.

    Args:
        dataset: a :class:`FileDataset`, or a sequence of paths (no labels).
        batch_size: samples per batch.
        decode: ``bytes -> sample``, run in ``num_workers`` processes; default ``ImageDecoder(224)``.
            ``None`` delivers the raw bytes (no processes). Any callable: a module function, a lambda, a
            closure, a callable object, a function defined (or redefined) in a notebook or ``__main__`` at
            any time. It is sent to the workers by value (cloudpickle) when the loader is made, so each
            loader runs its own; one that cannot be sent (it holds a lock or a socket) is a ``ValueError``.
        collate: ``list of samples -> batch``; default :func:`default_collate`. Runs on the
            loader's collate thread, in the loader process by default (``loader_process``).
        shuffle: a new order each epoch, which depends only on ``(seed, epoch)``.
        seed: the seed of the order and of :func:`sample_rng` (default 0).
        drop_last: leave out the last batch if it is partial. With ``on_error="skip"`` (and
            the default collate, ``ordered=True``), batches that lost samples are topped up
            with the next samples of the epoch, so every batch is full.
        num_workers: decode processes (default: the CPUs this process may really use,
            :func:`~aioloader.config.usable_cpus`: its CPU affinity lowered to the CPU quota of its cgroup
            and its ancestors, rounded up, so a container limited to 4 CPUs on a 64-core node starts 4, and
            so does a job in a nested cgroup of 4; divided by the ranks on the node under ``torchrun`` or
            ``srun``, at least 1: ``stats.cpus_per_rank``). ``"auto"`` starts that many, and lets as many
            decode at once as leaves the CPUs the trainer's process measurably uses (measured every 2 s).
        io_concurrency: file reads in flight at most, or ``"auto"`` (default): the loader moves it while
            running, by Little's law, to the reads the decoders need (read latency times the rate they can
            decode, twice over). It starts at 64, or at its floor where that is higher: the reads of two
            decode chunks per worker, at least 16 (128 with ``batch_size=256`` and 2 workers). Its ceiling,
            1,024, is lowered to what the open-file limit allows and to what fits in an eighth of the
            available memory (at most 8 GiB; never below the floor). ``stats.io_concurrency`` says where it
            is. Neither setting changes batches, their order or a resume point.
        prefetch: finished batches buffered ahead of the trainer.
        ordered: batches in sampler order (default), or with False each as soon as it is built: the same
            batches (each holds the samples the sampler gave it), in completion order.
        device: None or ``"cpu"``; ``"cuda:N"`` delivers batches on that GPU, ``"cuda"`` on this rank's,
            settled when the loader starts: the current device if one was set, else ``LOCAL_RANK``'s
            (``mpirun``: ``OMPI_COMM_WORLD_LOCAL_RANK``'s or ``MPI_LOCALRANKID``'s; ``srun``:
            ``SLURM_LOCALID``'s), so under ``torchrun`` each rank delivers to its own GPU.
        pin_memory: copy to the GPU from page-locked memory, asynchronously (default: True with CUDA;
            ignored without it): straight from the loader process's slabs, page-locked in place
            (``cudaHostRegister``, once per slab), else through pinned staging buffers (a loader in the
            trainer's process, registration refused). False copies from pageable memory.
        on_error: ``"raise"`` the first :class:`SampleError`, or ``"skip"`` failed samples
            (counted in ``stats``, one ``aioloader`` WARNING per file).
        max_failures: with ``"skip"``, give up with a :class:`LoaderError` (not a :class:`SampleError`): an
            int ``n`` at the failure after ``n``; a float ``f`` when failures / samples attempted exceeds
            ``f``, over the loader's life (counts restored by ``load_state_dict`` included) and once at
            least 100 samples were attempted: judged at each failure after that, when the count of samples
            attempted reaches 100, and at the end of each epoch, where the error comes after all the epoch's
            batches (so failures that all came early are judged too).
        read: blocking ``path -> bytes`` run on the I/O threads instead of reading the file (another
            store, injected delays and faults); thread-safe. In the loader process by default.
        zero_copy: decoded arrays and tensors (alone or nested in dicts, tuples, lists) are
            written by the workers into shared-memory batch slabs; once the loader has learned
            the samples' layout (from the first decode task, or a declared ``output_shape``), each
            batch tensor *is* its slab, and samples of varying shapes reach a custom
            ``collate`` as views of it. A slab is reused once the last tensor or view of it is
            garbage. False copies each batch (or each sample, for a custom collate) out into
            ordinary memory, so the slab is reused at once.
        read_retries: tries again, with backoff, after a transient read error (EIO, EAGAIN,
            ETIMEDOUT, too many open files, ...); counted in ``stats.read_retries``.
        sample_timeout: seconds a read, or a decode, may take; past it the sample fails with
            :class:`LoaderTimeoutError` (a hung decode's worker is killed and replaced).
        max_worker_restarts: decode-pool rebuilds after worker crashes (signal, ``os._exit``)
            over the loader's life; the crash past it raises :class:`WorkerCrashedError`.
        rank: this process's shard of every epoch (default: torch.distributed's rank when a process group
            is initialised, else 0). Ranks see disjoint parts of the order, each the same number of batches.
        world_size: the number of shards (default: torch.distributed's, else 1).
        pad_shards: make shards equal by repeating a few samples (default, like ``DistributedSampler``),
            or by dropping the tail that does not fill a round.
        locality: :class:`Locality` for the shard-local order (default None: uniform over all
            samples): with samples stored as runs in a few large files (tar shards,
            :meth:`FileDataset.from_tars`), each rank reads a contiguous block of an order in
            which shards come whole, in a shuffled order, their samples mixed within
            ``Locality(buffer)`` places (webdataset's order, for storage where a ranged read
            costs more than its bytes). Needs ``shuffle=True``; resumes and re-shards exactly.
        loader_process: where the event loop, the reads, the decode pool and ``collate`` run. ``"auto"``
            (default): in a loader process of their own (forked by the zygote, so it starts in milliseconds)
            wherever a zygote can be made; the trainer's process keeps only the bridging thread, and batches
            cross as references to their shared-memory slabs. This takes the loader's per-batch CPU out of
            the trainer's process (its GIL included). ``read`` and ``collate`` are then sent there by value
            like ``decode`` (any callable that can be sent), and run in that process: state they change is
            not the trainer's. Arrays a custom ``collate`` makes anew (not views of its samples) cross as
            one copy: from 1 MiB up into shared memory the loader process reuses
            (:mod:`aioloader.run.wire`), smaller ones pickled. ``"auto"`` loads in-process for ``decode=None``
            on local files read by the library (a process would copy the bytes once more) and, with a DEBUG
            line, where no zygote can be made or ``read`` or ``collate`` cannot be sent. ``True`` insists: a
            ``read`` or ``collate`` that cannot be sent is a ``ValueError``, and where no zygote can be made
            the loader runs in-process with a WARNING. ``False`` runs them in the trainer's process, on the
            ``aioloader-loop`` thread: for a ``read`` or ``collate`` that must share state with the trainer,
            or to debug them with ``pdb`` or breakpoints. :attr:`runtime` says where a started loader runs.
        storage_options: for ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` paths, the
            options of their fsspec filesystem (for S3: ``key``, ``secret``, ``token``,
            ``endpoint_url``, ``client_kwargs``), one dict for every protocol or one per
            protocol (``{"s3": {...}, "http": {...}}``). Never logged or shown. URLs are read
            on the event loop, ``io_concurrency`` at once (``pip install 'aioloader[remote]'``).
        storage_backend: the client of those reads: ``"auto"`` (in a loader process, obstore
            for ``s3://`` and ``http(s)://`` where it is installed and can take the options;
            else fsspec), ``"fsspec"``, or ``"obstore"`` (needs a loader process: refused
            with ``loader_process=False``, and replaced by fsspec, with a WARNING, where none
            can be made). See :mod:`aioloader.read.backends`.
        progress: a progress bar per epoch on stderr (tqdm): batches, samples/s, MB/s, the
            share of time the trainer waited (and a cache's hit share and bytes). ``True``
            draws it only when stderr is a terminal; ``"always"`` draws it anyway (a log).
        decode_on: ``"local"`` (default), or ``"ray"``: ``decode`` runs as Ray tasks on the cluster this
            process connected to with ``ray.init(...)`` (else the loader tries ``address="auto"``, then
            raises :class:`LoaderError`); ``num_workers``: tasks at once (None: the cluster's CPUs). Same
            batches as ``"local"``; URLs are read on the cluster. Loads in-process (``loader_process=True``
            is refused); ``close()`` leaves Ray connected. ``pip install 'aioloader[ray]'``.
        cache: a sample cache, :class:`~aioloader.Cache` (default None: every epoch reads the
            source): later epochs read what the first one kept, in memory or on local disk,
            optionally downscaled (``max_side``). ``stats.cache`` counts its hits.

    A sample is ``decoded`` or, with labels, ``(decoded, label)``; a batch is the collation of
    its samples (``(images, labels)`` with labels). Each iteration uses the epoch given to
    :meth:`set_epoch` since the previous iteration began, else the previous epoch + 1 (the
    first is 0). Starting a new iteration cancels an unfinished one.

    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch: the batches after a
    resume are exactly those an uninterrupted run would have delivered.
    """

    def __init__(
        self,
        dataset: FileDataset | Sequence[StrPath],
        *,
        batch_size: int = Sampling.batch_size,
        decode: Callable[[bytes], Any] | None = Decoding.decode,
        collate: Callable[[list[Any]], Any] | None = Delivery.collate,
        shuffle: bool = Sampling.shuffle,
        seed: int = Sampling.seed,
        drop_last: bool = Sampling.drop_last,
        num_workers: int | Literal["auto"] | None = Decoding.num_workers,
        io_concurrency: int | Literal["auto"] = Reading.io_concurrency,
        prefetch: int = Delivery.prefetch,
        ordered: bool = Delivery.ordered,
        device: str | torch.device | None = Delivery.device,
        pin_memory: bool | None = Delivery.pin_memory,
        on_error: OnError = Failures.on_error,
        max_failures: int | float | None = Failures.max_failures,
        read: Callable[[str], bytes] | None = Reading.read,
        zero_copy: bool = Delivery.zero_copy,
        read_retries: int = Reading.read_retries,
        sample_timeout: float | None = Failures.sample_timeout,
        max_worker_restarts: int = Decoding.max_worker_restarts,
        rank: int | None = Sampling.rank,
        world_size: int | None = Sampling.world_size,
        pad_shards: bool = Sampling.pad_shards,
        locality: Locality | None = Sampling.locality,
        loader_process: LoaderProcess = Delivery.loader_process,
        storage_options: Mapping[str, Any] | None = Reading.storage_options,
        storage_backend: StorageBackend = Reading.storage_backend,
        progress: Progress = Delivery.progress,
        decode_on: DecodeOn = Decoding.decode_on,
        cache: Cache | None = LoaderConfig.cache,
    ) -> None:
        given = {name: value for name, value in locals().items() if name not in ("self", "dataset")}
        self._dataset = FileDataset.coerce(dataset)
        if self._dataset.members is not None:  # from_tars(members=...): the decode gets a dict
            given["decode"] = with_members(self._dataset.members, decode, cache)
        remote = is_remote(self._dataset.path(0))
        # The zygote is made before the device is resolved (CUDA's context): see zygote.early.
        self._config = LoaderConfig.create(given, remote=remote, early=zygote.early)
        self._state = State.IDLE
        self._lock = threading.Lock()
        self._runtime: Runtime | ProcessRuntime | None = None
        self._where: Literal["process", "thread"] | None = None
        self._device: torch.device | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._counters = self._config.counters(remote)
        self._epochs = Epochs(self._config.sampling, len(self._dataset))

    # -- properties -------------------------------------------------------------------------
    @property
    def config(self) -> LoaderConfig:
        """The settings, part by part (``config.sampling.batch_size``, ``config.decoding.decode``,
        ...; :mod:`aioloader.config`), and what the build decided (``config.build.workers``,
        ``config.build.start_in``)."""
        return self._config

    @property
    def device(self) -> torch.device:
        """The device batches are delivered on: ``device`` as given, with ``"cuda"`` settled
        to this rank's GPU when the loader starts (:func:`~aioloader.run.start.settle_device`)."""
        return self._device if self._device is not None else self._config.delivery.target

    @property
    def dataset(self) -> FileDataset:
        return self._dataset

    @property
    def state(self) -> State:
        return self._state

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) iteration."""
        return self._epochs.epoch

    @property
    def runtime(self) -> Literal["process", "thread"] | None:
        """Where the started loader's pipeline runs: ``"process"`` (a loader process) or ``"thread"``
        (the ``aioloader-loop`` thread of this process); None until it starts, kept after :meth:`close`."""
        return self._where

    @property
    def stats(self) -> LoaderStats:
        """A snapshot of the counters (see :class:`LoaderStats`)."""
        return self._counters.snapshot()

    def __len__(self) -> int:
        """Batches per epoch on this rank (a resumed epoch delivers only the rest of them)."""
        s = self._config.sampling
        per_rank = shard_size(len(self._dataset), s.shard[1], s.pad_shards)
        return num_batches(per_rank, s.batch_size, s.drop_last)

    def __repr__(self) -> str:
        return f"<Loader {self._state.value} {self._dataset!r} batch_size={self._config.sampling.batch_size}>"

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (its shuffle order and augmentation seeds).
        After :meth:`load_state_dict`, the state's own epoch keeps its position."""
        self._epochs.set(epoch)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Loader:
        """Start the loop, bridging thread and worker processes now (``with`` does this);
        iterating starts them lazily otherwise. Returns self.

        Until the last open loader closes, the objects that exist now are frozen out of the
        cyclic garbage collector (:mod:`aioloader.safety.gcfreeze`): a full collection would
        otherwise stall every thread of the process, the trainer's included."""
        self._runtime_or_start()
        return self

    def _runtime_or_start(self) -> Runtime | ProcessRuntime:
        with self._lock:
            if self._state is State.CLOSED:
                raise LoaderClosedError(CLOSED_MESSAGE)
            if self._runtime is not None:
                self._runtime.check_owner()
            else:
                if self._device is None:  # on the starting thread: see settle_device
                    self._device = settle_device(self._config)
                runtime = start_runtime(self._config, self._device, self._dataset, self._counters)
                # The safety net: a loader dropped without close() still stops everything.
                self._finalizer = weakref.finalize(self, runtime.shutdown)
                self._runtime = runtime
                self._where = "process" if isinstance(runtime, ProcessRuntime) else "thread"
                self._state = State.STARTED
            return self._runtime

    def close(self) -> None:
        """Stop and join every thread and process the loader started. Idempotent."""
        with self._lock:
            if self._state is State.CLOSED:
                return
            self._state = State.CLOSED
            finalizer, self._finalizer = self._finalizer, None
            self._runtime = None
        if finalizer is not None:
            finalizer()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the caller's event loop. Idempotent."""
        await in_thread(self.close)
        sigterm.uninstall()  # back on the caller's thread, usually the main one

    def __enter__(self) -> Loader:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()  # never masks the body's exception: close does not raise

    async def __aenter__(self) -> Loader:
        if self._runtime is None and self._device is None:  # CUDA's current device is a thread's own
            self._device = settle_device(self._config)
        await in_thread(self.start)
        sigterm.install()  # back on the caller's thread, usually the main one
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- iteration --------------------------------------------------------------------------
    def _begin(self) -> Cursor:
        runtime = self._runtime_or_start()
        progress, point = self._epochs.begin()
        self._counters.begin_epoch(progress.epoch)
        run = runtime.start_run(progress.epoch, point)  # the runtime makes the epoch's plan
        done = 0 if point is None else point.start + len(point.done)
        bar = make_bar(self._config.delivery.progress, progress.epoch, progress.total, self._counters, done)
        return Cursor(runtime, run, progress, self._counters, lambda: self._state is State.CLOSED, bar)

    # -- resumption -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable snapshot of where this rank is in its epoch (batches the
        trainer has received; prefetched ones are not counted). See :mod:`aioloader.plan.resume`."""
        progress = self._epochs.progress(len(self))
        s = self._counters.snapshot()
        stats: dict[str, Any] = {"samples": s.samples, "batches": s.batches, "attempted": s.attempted}
        stats["failures_by_reason"] = s.failures_by_reason
        return make_state(self._config.sampling, len(self._dataset), progress, stats)

    def load_state_dict(self, state: dict[str, Any], *, allow_reshard: bool = False) -> None:
        """Resume from ``state`` (from :meth:`state_dict` of a loader over the same dataset,
        seed and batch size): the next iteration of the state's epoch delivers the batches
        that were not received yet. A state from another world size is refused unless
        ``allow_reshard``: then the samples no old rank received are spread over the new
        ranks, each once (plus the padding that keeps the ranks' batch counts equal)."""
        point = check_state(state, self._config.sampling, len(self._dataset), allow_reshard=allow_reshard)
        stats = state.get("stats") or {}
        self._counters.restore(
            int(stats.get("samples", 0)),
            int(stats.get("batches", 0)),
            dict(stats.get("failures_by_reason", {})),
            int(stats.get("attempted", 0)),
        )
        self._epochs.resume(point)

    def __iter__(self) -> Iterator[Any]:
        return SyncIter(self._begin())

    def __aiter__(self) -> AsyncIterator[Any]:
        return AsyncIter(self._begin())

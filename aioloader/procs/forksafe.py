"""When the trainer may be forked (the zygote's start), and what the forked copy does first:
aioloader's fork-safety rules, in one place.

A ``fork`` copies one thread, the caller's, and all memory as it was: a lock another thread
held at that moment stays held for ever in the copy and in all it forks. So the zygote is
forked only past threads of known kinds that hold nothing the copy will ever take
(:func:`how_to_start` on a :class:`Census`); any other thread, a Python thread among them,
and it starts in a fresh interpreter instead (:mod:`aioloader.procs.cleanstart`, a second or
more before the first batch). The kinds, and why each is safe to fork past:

- **OpenBLAS's server threads** (numpy's; its pthreads build): OpenBLAS stops them itself
  in its ``pthread_atfork`` handler before every fork, and starts them again at its next
  threaded call. :func:`census` stops them the same way before counting, so the count is
  exact whatever an earlier fork left (threadpoolctl's figure is the pool's size, not the
  threads alive).
- **An OpenMP runtime's pool** (PyTorch's intra-op threads on Linux are libgomp's): idle
  between parallel regions, each waits at its pool's barrier holding no lock. The copy has
  only the forking thread, whose pool still lists threads that do not exist there: a parallel
  region of more than one thread started by that thread would wait for them for ever (seen on
  16 cores, RESULTS §21). :func:`after_fork` therefore sets one thread for every OpenMP
  runtime first thing in the copy, before anything it runs or forks can start a region, and
  each helper sets torch's own count to one as it starts, as DataLoader's workers do
  (``torch.set_num_threads(1)``). Counted with
  threadpoolctl (the loky and scikit-learn authors' library for native thread pools): at
  most the pool's size less the caller per runtime.
- **PyTorch's pthreadpool** (its XNNPACK pool, made as ``torch.set_num_threads`` is
  called, of that many threads less the caller): PyTorch's own ``pthread_atfork`` handler
  has the copy leave the inherited pool unused and make a new one at its next use
  (``caffe2/utils/threadpool/pthreadpool-cpp.cc``). At most ``torch.get_num_threads() - 1``.
- **The CUDA driver's threads** (named ``cuda...``) and **PyTorch's autograd device
  threads** (``pt_autograd_...``): the copy never touches CUDA or a device's autograd, and
  PyTorch's own fork handler makes any use of them there an error ("Cannot re-initialize
  CUDA in forked subprocess"), not a hang.
- **A Jupyter kernel's threads**: ipykernel's and IPython's Python threads (its heartbeat,
  I/O, control, shell-channel and parent-poller threads, found by their class's or target's
  module) and libzmq's I/O and reaper threads (named ``ZMQbg/...``). The copy never uses
  the kernel's sockets or objects: :func:`after_fork` gives it new ``sys.stdout`` and
  ``sys.stderr`` on file descriptors 1 and 2 (which the kernel captures into the notebook),
  so a helper's ``print`` or warning takes no lock of the kernel's output stream; what the
  copy imports takes the import lock, which CPython makes anew in a forked child, as it does
  the GIL and :mod:`logging`'s locks; and helpers leave by ``os._exit``, so no inherited
  ZMQ context is ever terminated (which would wait for its threads). DataLoader's workers
  fork past these threads with none of that.

Threads are counted, not identified: the pools' threads are counted as at most their
pools' sizes, so where a pool has not run yet, a thread of an unknown kind can pass in its
place. Every OS thread is counted (``/proc/self/task``), and every Python thread is known.

Any other Python thread is never forked past: one may hold a lock that the copy takes again
(a stream's buffer lock mid-``print``, a handler's, a queue's). On Python 3.12 and later, a
fork past the native threads above is done without the interpreter's "multi-threaded"
``DeprecationWarning``: that warning is the general case this module decides case by case.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Census", "Start", "after_fork", "census", "cuda_initialized", "fork", "how_to_start"]

Start = Literal["fork", "spawn"]

#: Thread names (``/proc/<pid>/task/<tid>/comm``, prefixes) of the named native threads of
#: the kinds in the module docstring: the CUDA driver's, PyTorch's autograd device threads,
#: libzmq's (a Jupyter kernel's).
_NAMED_THREADS = ("cuda", "pt_autograd_", "ZMQbg/")

#: Top-level packages whose Python threads are a Jupyter kernel's.
_KERNEL_PACKAGES = frozenset({"ipykernel", "IPython"})


@dataclass(frozen=True)
class Census:
    """This process's threads, as the zygote's start sees them.

    ``os_threads``: its OS threads, every library's (None where ``/proc`` cannot say);
    ``python_threads``: ``threading.active_count()``, of which ``kernel_threads`` are a
    Jupyter kernel's; ``openmp_pool``: at most this many
    OpenMP pool threads (each runtime's pool size less its caller); ``torch_pool``: at most
    this many threads of PyTorch's pthreadpool; ``named_threads``: the
    CUDA driver's, PyTorch's autograd device threads and libzmq's, by name; ``cuda``: whether
    torch's CUDA context exists."""

    os_threads: int | None
    python_threads: int
    kernel_threads: int = 0
    openmp_pool: int = 0
    torch_pool: int = 0
    named_threads: int = 0
    cuda: bool = False

    @property
    def unknown(self) -> int | None:
        """OS threads beyond the caller that none of the safe kinds accounts for (None: not
        counted)."""
        if self.os_threads is None:
            return None
        known = self.kernel_threads + self.named_threads + self.openmp_pool + self.torch_pool
        return max(0, self.os_threads - 1 - known)

    @property
    def other_python(self) -> int:
        """Python threads beyond the caller that are not a Jupyter kernel's."""
        return self.python_threads - 1 - self.kernel_threads


def how_to_start(c: Census) -> Start:
    """``"fork"`` where every thread but the caller is of a kind safe to fork past (see the
    module), else ``"spawn"``: a fresh interpreter."""
    if c.other_python != 0:
        return "spawn"
    if c.os_threads is None:  # only Python's threads are known, and whether CUDA runs
        return "spawn" if c.cuda else "fork"
    return "fork" if c.unknown == 0 else "spawn"


def census() -> Census:
    """Count this process's threads (see :class:`Census`), OpenBLAS's first stopped as
    they would be for a fork (only where no other Python thread could be inside it)."""
    python, kernel = threading.active_count(), _kernel_threads()
    pools = _native_pools(stop_openblas=python == 1 + kernel)
    openmp = sum(max(0, n - 1) for api, n in pools if api == "openmp")
    names = _task_names()
    os_threads = None if names is None else len(names)
    named = 0 if names is None else sum(n.startswith(_NAMED_THREADS) for n in names)
    return Census(os_threads, python, kernel, openmp, _torch_pool(), named, cuda_initialized())


def after_fork(c: Census) -> None:
    """In the copy forked past the threads of census ``c``, first thing: one thread for every
    OpenMP runtime (torch's among them), so that nothing run here or forked from here waits on a pool
    thread the fork did not copy; past a Jupyter kernel's, standard streams of its own (see
    the module). Inherited by every process it forks."""
    if c.kernel_threads:
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - for this process's life
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # Not torch.set_num_threads: in a copy forked past its pthreadpool it makes a new pool,
    # with threads, here. The OpenMP limit is torch's intra-op count too (its OpenMP build
    # reads omp_get_max_threads); each helper sets torch's own as it starts.
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        threadpool_limits(limits=1, user_api="openmp")
    except Exception:  # noqa: BLE001 - no OpenMP runtime to limit, or none that answers
        pass


def fork() -> int:
    """``os.fork()``, decided by :func:`how_to_start`, so without Python 3.12's general
    warning about forking a multi-threaded process (see the module). ``sys.stdout`` and
    ``sys.stderr`` are flushed first, as multiprocessing's own fork does: what the trainer
    had printed but not yet written would be copied into the child, and written again by
    every helper that flushes it at its exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):  # None, closed, or a broken pipe
            pass
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        return os.fork()


def cuda_initialized() -> bool:
    """Whether torch, if imported, has made its CUDA context (True when it cannot say)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken torch: assume the worst
        return True


def _native_pools(stop_openblas: bool) -> list[tuple[str, int]]:
    """``(internal API, pool size)`` of each native thread pool threadpoolctl finds; with
    ``stop_openblas``, OpenBLAS's pthreads server threads stopped first (its own
    ``blas_thread_shutdown_``, which its fork handler calls); a pool that cannot be stopped
    stays counted as an unknown thread."""
    try:
        from threadpoolctl import ThreadpoolController

        controllers: list[Any] = list(ThreadpoolController().lib_controllers)
    except Exception:  # noqa: BLE001 - unknown: every thread counts as unknown
        return []
    found = []
    for lib in controllers:
        api, size = str(getattr(lib, "internal_api", "")), int(getattr(lib, "num_threads", 1) or 1)
        if api == "openblas" and getattr(lib, "threading_layer", None) == "pthreads" and stop_openblas:
            shutdown = getattr(getattr(lib, "dynlib", None), "blas_thread_shutdown_", None)
            if shutdown is not None:
                shutdown()
        found.append((api, size))
    return found


def _torch_pool() -> int:
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        return max(0, int(torch.get_num_threads()) - 1)
    except Exception:  # noqa: BLE001 - a broken torch: none allowed
        return 0


def _task_names() -> list[str] | None:
    """The names of this process's OS threads (``/proc/self/task/*/comm``; one gone while
    read is left out), None where ``/proc`` cannot say."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names


def _kernel_threads() -> int:
    count = 0
    for t in threading.enumerate():
        target = getattr(t, "_target", None)
        modules = (type(t).__module__, getattr(target, "__module__", None) or "")
        count += any(m.split(".")[0] in _KERNEL_PACKAGES for m in modules)
    return count

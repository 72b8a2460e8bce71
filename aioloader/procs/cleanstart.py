"""How the zygote starts (:func:`how_to_start`), its start in a fresh interpreter
(:func:`spawn`, :func:`main`), and the fork-server loop both starts end in (:func:`serve`).

A ``fork`` copies one thread, the caller's, and every lock as it was: one held by another
thread at that moment (the CUDA driver's, OpenMP's, malloc's, a logging handler's) stays
held for ever in the copy and in all it forks. So the zygote is forked from the trainer only
where the trainer will have exactly one OS thread when it forks: counted in
``/proc/self/task`` (every thread, a C library's too: PyTorch's intra-op pool, the CUDA
driver's), less OpenBLAS's server threads, which OpenBLAS itself stops before any fork (its
``pthread_atfork`` handler; numpy's pool starts at ``import numpy`` on a machine with several
cores, and Python 3.12 forks such a process without its multi-threaded warning: the threads
are gone by then). OpenBLAS's threads are counted with threadpoolctl (the loky and
scikit-learn authors' library for native thread pools). Where ``/proc`` cannot be read:
Python's own threads, and whether torch has made its CUDA context. A trainer that has made
its CUDA context or run PyTorch's intra-op pool has other threads, so there the start is the
other one (about a second more before the first batch, measured in RESULTS): a fresh interpreter,
exec'd with only the zygote's listening socket and its "alive" pipe (the way the stock
``multiprocessing.forkserver`` starts, with ``util.spawnv_passfds``: no Python code runs
between its fork and its exec, and nothing of the trainer's is copied), which imports what
the loader process and the decode workers need (:func:`preloads`) before it serves, so the
first batch does not wait for imports in every worker.

Its OpenBLAS is told to use one thread, so the zygote stays single-threaded while it forks
(the helpers run one compute thread each anyway; the variable set for it reaches no helper,
see below). The trainer's environment, working
directory and ``sys.path`` reach each helper per loader (:mod:`aioloader.procs.forking`), as
they do from a forked zygote.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Sequence
from multiprocessing import forkserver, spawn, util
from typing import Any, Literal

from aioloader.procs import roles
from aioloader.safety import lifeline

__all__ = [
    "Start",
    "cuda_initialized",
    "how_to_start",
    "main",
    "modules_of",
    "os_threads",
    "preloads",
    "serve",
    "spawn_zygote",
    "stopped_at_fork",
]

Start = Literal["fork", "spawn"]

#: What the helpers import: the loader process, a decode worker, a reader process and how
#: each starts (numpy and Pillow come with them); uvloop, the loader process's event loop,
#: imported as it starts; the formats a worker's ``PIL.Image.preinit()`` registers; numpy's
#: random generators (``sample_rng``).
_HELPERS = (
    "aioloader.procs.forking",
    "aioloader.decode.worker",
    "aioloader.decode.image",
    "aioloader.read.readproc",
    "aioloader.run.loaderproc",
    "numpy",
    "numpy.random",
    "PIL.Image",
    "PIL.BmpImagePlugin",
    "PIL.GifImagePlugin",
    "PIL.JpegImagePlugin",
    "PIL.PpmImagePlugin",
    "PIL.PngImagePlugin",
    "cloudpickle",
    "uvloop",
)

#: The zygote's environment while it imports: one OpenBLAS thread (its pool starts at import).
_SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1"}


def how_to_start(os_threads: int | None, python_threads: int, cuda: bool, stopped_at_fork: int = 0) -> Start:
    """``"fork"`` where forking this process copies no other thread (see the module):
    ``os_threads``, its OS threads (None where they cannot be counted), ``stopped_at_fork``
    of them stopped by their own library before a fork (OpenBLAS's); ``python_threads``,
    ``threading.active_count()``; ``cuda``, whether torch's CUDA context exists. Else
    ``"spawn"``: a fresh interpreter."""
    if os_threads is not None:
        return "fork" if os_threads - stopped_at_fork == 1 and python_threads == 1 else "spawn"
    return "fork" if python_threads == 1 and not cuda else "spawn"


def stopped_at_fork() -> int:
    """OpenBLAS's server threads in this process, of its pthreads build (its pool of ``n``
    threads runs ``n - 1`` of them beside the caller); 0 where threadpoolctl cannot say."""
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

        pools = threadpool_info()
    except Exception:  # noqa: BLE001 - unknown: count every thread
        return 0
    # Only its pthreads build stops them (an OpenMP build's threads are libgomp's, which
    # nothing stops: PyTorch's own OpenBLAS on aarch64 is one).
    return sum(
        max(0, int(p.get("num_threads", 1)) - 1)
        for p in pools
        if p.get("internal_api") == "openblas" and p.get("threading_layer") == "pthreads"
    )


def os_threads() -> int | None:
    """This process's OS threads (Linux's ``/proc/self/task``), None where unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def cuda_initialized() -> bool:
    """Whether torch, if imported, has made its CUDA context (True when it cannot say)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken torch: assume the worst
        return True


def preloads(extra: Sequence[str] = ()) -> list[str]:
    """The modules a clean zygote imports before serving: the helpers' (:data:`_HELPERS`),
    torch when the trainer has imported it, aioloader's modules the trainer has imported, and
    ``extra`` (:func:`modules_of` the loader's callables)."""
    torch = ["torch"] if "torch" in sys.modules else []
    # aioloader's own modules the trainer has, as a forked zygote would: the loader process
    # imports most of them as it builds its pipeline.
    ours = sorted(name for name in list(sys.modules) if name.startswith("aioloader."))
    return list(dict.fromkeys([*_HELPERS, *torch, *ours, *extra]))


def modules_of(*callables: object) -> list[str]:
    """The modules a helper imports to run ``callables`` (a decode function, say): each
    one's own module (a callable object's class's), unless it is ``__main__`` (sent by value),
    and the modules its code names from its globals (``np`` in ``np.asarray``). What a forked
    zygote would hold already, a clean one imports once, not every worker."""
    names: list[str] = []
    for fn in callables:
        if fn is None:
            continue
        owner = fn if isinstance(fn, (types.FunctionType, types.MethodType)) else type(fn)
        module = getattr(owner, "__module__", None)
        if isinstance(module, str) and module not in ("__main__", "builtins"):
            names.append(module)
        code, found = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
        for name in code.co_names if code is not None else ():
            value = found.get(name)
            if isinstance(value, types.ModuleType) and value.__name__ != "__main__":
                names.append(value.__name__)
    return list(dict.fromkeys(names))


def spawn_zygote(listener_fd: int, alive_r: int, parent: int | None, extra: Sequence[str] = ()) -> int:
    """Start the zygote in a fresh interpreter that inherits only ``listener_fd`` and
    ``alive_r``, with this process's interpreter flags and ``sys.path``; its pid."""
    cmd = (
        f"import os; os.environ.update({_SINGLE_THREADED!r}); import sys; sys.path[:] = {sys.path!r}; "
        "from aioloader.procs.cleanstart import main; "
        f"main({listener_fd}, {alive_r}, {parent!r}, {preloads(extra)!r})"
    )
    exe = spawn.get_executable()
    # An exec that fails is only a child exiting 255: say so now (OSError: no zygote), as
    # where this user may not run the interpreter it was started with (a virtualenv
    # pointing into another user's home).
    if not os.access(exe, os.X_OK):
        raise PermissionError(f"cannot run {os.fsdecode(exe)}: no zygote started clean")
    args = [exe, *util._args_from_interpreter_flags(), "-c", cmd]  # type: ignore[attr-defined]
    return util.spawnv_passfds(os.fsencode(exe), args, [listener_fd, alive_r])


def main(listener_fd: int, alive_r: int, parent: int | None, modules: list[str]) -> None:  # pragma: no cover
    """The clean zygote's whole life (runs in the interpreter :func:`spawn_zygote` starts)."""
    begin(parent)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a helper that needs it imports it (and says why)
            continue
    serve(listener_fd, alive_r)


def begin(parent: int | None) -> None:
    """What a zygote does first, however started: take its role and name
    (``aioloader-fork``), and, when ``parent`` (the trainer's pid) is given, ask the kernel
    to end it with the trainer (only when the trainer started it from its main thread)."""
    roles.become("zygote")
    if parent is not None:
        lifeline.die_with_parent(parent)


def serve(listener_fd: int, alive_r: int) -> None:  # pragma: no cover - runs in the zygote
    """Run multiprocessing's fork-server loop until the "alive" pipe closes (the trainer is
    gone), then end this process; never returns."""
    code = 0
    try:
        # A worker being forked when the trainer dies finds its start-up data cut short
        # (EOFError, reported by the fork-server loop through sys.excepthook): nobody is
        # left to start it for, or to read a traceback about it.
        sys.excepthook = _quiet_when_orphaned
        forkserver.main(listener_fd, alive_r, [])
    except SystemExit:  # the trainer's process is gone (the "alive" pipe closed)
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happens, never return into the caller's code
        code = 1
    finally:
        os._exit(code)


def _quiet_when_orphaned(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    if not issubclass(kind, EOFError):
        sys.__excepthook__(kind, value, tb)

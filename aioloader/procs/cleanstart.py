"""The zygote's start in a fresh interpreter (:func:`spawn_zygote`, :func:`main`), and the
fork-server loop both starts end in (:func:`serve`).

Where the trainer has a thread that is not safe to fork past
(:mod:`aioloader.procs.forksafe`: a Python thread, an unknown native one), the zygote is a
fresh interpreter, exec'd with only its listening socket and its "alive" pipe (the way the
stock ``multiprocessing.forkserver`` starts, with ``util.spawnv_passfds``: no Python code runs
between its fork and its exec, and nothing of the trainer's is copied), which imports what
the loader process and the decode workers need (:func:`preloads`) before it serves, so the
first batch waits for those imports once, not in every worker (about a second more than a
forked zygote, RESULTS §32).

Its OpenBLAS is told to use one thread, so the zygote stays single-threaded while it forks
(the helpers run one compute thread each anyway; the variable set for it reaches no helper,
see below). The trainer's environment, working directory and ``sys.path`` reach each helper
per loader (:mod:`aioloader.procs.forking`), as they do from a forked zygote.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Sequence
from multiprocessing import forkserver, spawn, util
from typing import Any

from aioloader.procs import roles
from aioloader.safety import lifeline

__all__ = [
    "import_all",
    "main",
    "modules_of",
    "preloads",
    "serve",
    "spawn_zygote",
]

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


def import_all(modules: Sequence[str]) -> None:
    """Import each of ``modules`` not imported yet. One that fails is left to the helper that
    needs it, which imports it again and says why."""
    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see the docstring
            continue


def main(listener_fd: int, alive_r: int, parent: int | None, modules: list[str]) -> None:  # pragma: no cover
    """The clean zygote's whole life (runs in the interpreter :func:`spawn_zygote` starts)."""
    begin(parent)
    import_all(modules)
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

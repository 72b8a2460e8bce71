"""How aioloader's helper processes are started: never by running the training script again.

multiprocessing starts a fork-server child by sending it "preparation data", and that data
names the main module (``init_main_from_path``, or ``init_main_from_name`` under
``python -m``) so the child can import it as ``__mp_main__`` and unpickle functions defined
there by reference. A fork server whose main module differs by path re-runs it: with
``python ../train.py`` the script's ``__file__`` keeps the ``..`` while the data carries the
normalised path, so every worker ran the script's top level again (a script without an
``if __name__ == "__main__":`` guard then made a loader inside each worker, and hung).

aioloader needs none of that: every callable it sends goes by value (:mod:`aioloader.base.sendable`),
and the zygote already holds the trainer's ``__main__``. The Popen classes here send the
preparation data without the main module, for the zygote's children and for the stock fork
server's alike, so no helper ever imports or runs the script, however it was started
(a relative path, ``..``, a symlink, ``python -m``, torchrun).

What a helper starts with is the asking process's present, never a snapshot: the working
directory and ``sys.path`` travel in the preparation data, and its environment variables
(:func:`follow_environ`) with the process object, so a variable set, changed or removed
after an earlier loader started (a notebook cell exporting a token, ``os.environ[...] =``)
is seen by the next loader's helpers as it is now. The zygote's own ``os.environ`` is a copy
of the moment it was forked and must never reach them. (Variables a library read when it
was imported, in the zygote, such as ``OMP_NUM_THREADS`` for torch, keep the value it read
then, as in any forked child.)

What a helper is, once started, is recorded by :func:`aioloader.procs.roles.become`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from multiprocessing import context as mpcontext
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from typing import Any

__all__ = ["HelperProcess", "StockContext", "follow_environ", "preparation_data"]

#: The keys of multiprocessing's preparation data that make a child import the main module.
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


def preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a child named ``name``, less the main module
    (sys.path, the working directory and the authkey stay)."""
    data: dict[str, Any] = spawn.get_preparation_data(name)
    for key in _MAIN_KEYS:
        data.pop(key, None)
    return data


def follow_environ(environ: Mapping[str, str]) -> None:
    """Make this process's environment ``environ``: variables it lacks are removed, others
    set (through ``os.environ``, so C code's ``getenv`` sees them too)."""
    for name in [n for n in os.environ if n not in environ]:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


class HelperProcess(mpcontext.ForkServerProcess):
    """A fork-server process that takes the asking process's environment as it was at
    :func:`launch` (see the module docstring) before it runs anything."""

    _environ: dict[str, str] | None = None

    def run(self) -> None:
        if self._environ is not None:
            follow_environ(self._environ)
        super().run()


def launch(popen: popen_forkserver.Popen, process_obj: Any, server: Any) -> None:
    """``popen_forkserver.Popen._launch`` with :func:`preparation_data`, asking ``server``
    (a ``ForkServer``) for the new process, which gets this process's environment as it is
    now (:class:`HelperProcess`)."""
    process_obj._environ = dict(os.environ)
    buf = io.BytesIO()
    mpcontext.set_spawning_popen(popen)
    try:
        reduction.dump(preparation_data(process_obj._name), buf)
        reduction.dump(process_obj, buf)
    finally:
        mpcontext.set_spawning_popen(None)
    popen.sentinel, w = server.connect_to_new_process(popen._fds)  # type: ignore[attr-defined]
    # Kept open: the child sees its parent die when this end closes.
    parent_w = os.dup(w)
    popen.finalizer = util.Finalize(popen, util.close_fds, (parent_w, popen.sentinel))  # type: ignore[attr-defined]
    with open(w, "wb", closefd=True) as f:
        f.write(buf.getbuffer())
    popen.pid = forkserver.read_signed(popen.sentinel)


class _StockPopen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        launch(self, process_obj, forkserver._forkserver)


class _StockProcess(HelperProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _StockPopen(process_obj)


class StockContext(mpcontext.ForkServerContext):
    """multiprocessing's ``forkserver`` context, whose children never import the main
    module (the fallback where no zygote can be made)."""

    Process = _StockProcess

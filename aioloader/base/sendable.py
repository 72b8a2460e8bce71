"""Callables sent by value to the processes that run them.

``decode`` runs in worker processes, and ``read`` and ``collate`` run in the loader process
when there is one (``loader_process="auto"``, the default, or True). Plain pickle sends a
function by reference (module and name), so the receiving process must find it there: a
lambda or a closure cannot be sent at all, and a function defined in ``__main__`` (a
notebook cell, a script) is looked up in the receiver's copy of ``__main__``, which, in a
process forked earlier, is a stale snapshot: an edited cell ran its old definition, and a
function defined after the first loader started was missing.

cloudpickle, the library Ray, Dask and loky use for exactly this, sends what cannot be found
by reference (``__main__``, lambdas, closures, classes defined in a notebook) by value and
everything importable by reference. Each loader pickles its callables once, when it is made
(:func:`dumps`), so one that cannot be sent at all (it holds a lock, a socket, an open file)
is a ``ValueError`` naming the argument then, not a worker that fails later; a worker
unpickles it once, when it starts (:func:`loads`). Unpickling needs only the standard
library's ``pickle`` and an importable cloudpickle.

A process on another machine (``decode_on="ray"``) has the installed packages, but not the
user's own modules beside the training script (``from myaugment import crop``): with
``elsewhere=True`` those go by value too (:func:`user_modules`: every loaded module whose
file is outside the interpreter's installation and its site-packages).

A function sent by value keeps the file its code came from (:class:`_Pickler`): cloudpickle
3 writes ``"<dynamic-code>"`` there (for payloads that do not depend on where code was
defined), so a traceback from a user's ``decode`` in a worker said ``File "<dynamic-code>"``
and no source line. With the real path, the worker's ``linecache`` reads the line from the
script, as it would in the trainer.
"""

from __future__ import annotations

import os
import pickle
import site
import sys
import sysconfig
from io import BytesIO
from types import CodeType, ModuleType
from typing import Any

import cloudpickle

from aioloader.errors import LoaderError
from aioloader.procs import roles

__all__ = ["dumps", "loads", "user_modules"]


def user_modules() -> list[ModuleType]:
    """The loaded modules that are the user's own code: a file outside the interpreter's
    installation (its standard library and every site-packages), other than ``__main__``
    (cloudpickle sends what it uses by value anyway) and aioloader."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    installed.update(os.path.realpath(p) for p in sysconfig.get_paths().values())
    installed.update(os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()])
    roots = tuple(p.rstrip(os.sep) + os.sep for p in installed)
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or name.split(".")[0] == "aioloader" or not isinstance(file, str):
            continue
        if not os.path.realpath(file).startswith(roots):
            found.append(module)
    return found


# cloudpickle's reducer for code objects, whose arguments to CodeType we correct.
_reduce_code = cloudpickle.Pickler.dispatch_table[CodeType]
_PLACEHOLDER = "<dynamic-code>"


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's pickler, with each code object's own ``co_filename`` kept."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is CodeType:
            make, args = _reduce_code(obj)
            # co_filename is the only str argument that can equal the placeholder (the
            # others are identifiers, bytes and tuples).
            return make, tuple(obj.co_filename if a == _PLACEHOLDER else a for a in args)
        return super().reducer_override(obj)


def _pickle(value: Any) -> bytes:
    out = BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def dumps(value: Any, argument: str, runs_in: str, elsewhere: bool = False) -> bytes:
    """``value`` pickled by value where it must be (see the module), for the argument named
    ``argument`` that runs in ``runs_in``; ``ValueError`` naming both when it cannot be.
    ``elsewhere``: for another machine, the user's own modules by value too."""
    registered = []
    try:
        if elsewhere:
            for module in user_modules():
                try:
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
                except ValueError:  # not in sys.modules under its name any more
                    pass
        return _pickle(value)
    except Exception as exc:
        raise ValueError(
            f"{argument}={value!r} cannot be sent to {runs_in}: {type(exc).__name__}: {exc}. "
            f"It may be any function, lambda, closure or callable object, but what it holds must "
            f"be picklable: create locks, sockets, open files and clients inside it (on first "
            f"use) rather than holding them"
        ) from exc
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def loads(blob: bytes, argument: str = "value") -> Any:
    """The value :func:`dumps` pickled; :class:`~aioloader.LoaderError` naming ``argument``
    and this process when it does not unpickle here (a module the receiver cannot import,
    an object whose unpickling fails)."""
    try:
        return pickle.loads(blob)
    except Exception as exc:
        raise LoaderError(
            f"{argument} could not be loaded in process {os.getpid()} ({roles.role() or 'a process'}) "
            f"that runs it: {type(exc).__name__}: {exc}"
        ) from exc

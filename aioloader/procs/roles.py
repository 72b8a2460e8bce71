"""What each of aioloader's helper processes is, and what ``ps``, ``top`` and ``htop`` call it.

A helper records its role first thing (:func:`become`: ``"zygote"``, ``"loader"``,
``"worker"``, ``"reader"``; what it forks inherits it) and takes that role's name in
``/proc/<pid>/comm`` (:data:`NAMES`), so it shows as itself rather than as one more
``python``. A loader cannot be started inside a helper (:func:`refuse_loader_here`): its
code would run in a worker or the loader process, where a second pool of helpers is never
what the user meant.
"""

from __future__ import annotations

import ctypes
import os
import sys

from aioloader.errors import LoaderError

__all__ = ["NAMES", "become", "name_process", "refuse_loader_here", "role"]

#: What each helper is called where ``ps``, ``top`` and ``htop`` look (``/proc/<pid>/comm``),
#: by its role. The kernel keeps 15 bytes of a name, so each is at most 15 and reads whole
#: (``aioloader-worker``, 16, showed as ``aioloader-worke``); all start with ``aioloader``,
#: so ``pgrep aioloader`` finds every one.
NAMES = {
    "zygote": "aioloader-fork",  # the zygote: the fork server that makes the others
    "loader": "aioloader-loop",  # the loader process: the loader's event loop, reads, collate
    "worker": "aioloader-work",  # a decode worker
    "reader": "aioloader-read",  # a reader process (fast local reads off the loop)
}

_PR_SET_NAME = 15
#: The kernel keeps 16 bytes of a task's name, the terminating NUL included.
_NAME_MAX = 15

_role: str | None = None


def name_process(name: str) -> bool:
    """Set this process's name as ``ps -o comm``, ``top`` and ``htop`` show it
    (``/proc/<pid>/comm``; Linux, at most 15 bytes, longer is cut). False elsewhere, or if
    the call failed.

    ``PR_SET_NAME`` names the calling thread, and a process's comm is its main thread's:
    call it from the main thread, before starting threads, which inherit the name."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        raw = ctypes.c_char_p(name.encode()[:_NAME_MAX])
        return bool(libc.prctl(_PR_SET_NAME, raw, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def become(what: str) -> None:
    """Record that this process is aioloader's ``what`` (a key of :data:`NAMES`; inherited
    by what it forks) and give it that role's name where ``ps`` and ``top`` look
    (:func:`name_process`). Call it first: threads started afterwards inherit the name."""
    global _role
    _role = what
    name_process(NAMES[what])


def role() -> str | None:
    """What this process is to aioloader, or None for a user's process."""
    return _role


def refuse_loader_here() -> None:
    """Raise :class:`LoaderError` inside one of aioloader's own helper processes."""
    if _role is not None:
        raise LoaderError(
            f"a Loader cannot be started inside aioloader's own {_role} process (pid {os.getpid()}): "
            "make loaders in the training script, not in code that decode, read or collate run"
        )

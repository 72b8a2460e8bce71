"""What a read's result or failure becomes for its sample (no I/O): its bytes, or the
:class:`~aioloader.ReadError` naming its file; which errors are worth another try, and how
long to wait before it."""

from __future__ import annotations

import errno
import random

from aioloader.errors import ReadError, SampleError
from aioloader.memory.results import Source
from aioloader.read.urls import is_remote, redact

__all__ = ["TRANSIENT", "backoff", "checked"]


#: errno values worth another try: the storage may answer next time. EMFILE/ENFILE (too many
#: open files) clear as other reads finish.
TRANSIENT = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.EBUSY,
        errno.ESTALE,
        errno.EMFILE,
        errno.ENFILE,
    }
)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): 50 ms doubling, at most 2 s,
    times a random factor in [0.5, 1.5) (jitter: thousands of reads throttled at once must
    not all come back at the same moment)."""
    return float(min(2.0, 0.05 * 2 ** (attempt - 1)) * (0.5 + random.random()))


def checked(res: Source | OSError, path: str, index: int, io_concurrency: int) -> Source | SampleError:
    """A read's result as the sample's bytes, or the :class:`ReadError` it is (the cause
    chained without its traceback, whose frames would keep the slab mapped)."""
    remote = is_remote(path)
    what = "object" if remote else "file"
    path = redact(path)
    if isinstance(res, OSError):
        hint = ""
        if res.errno in (errno.EMFILE, errno.ENFILE):
            hint = f"; raise the open-file limit (ulimit -n) or lower io_concurrency={io_concurrency}"
        err = ReadError(f"cannot read {what}: {res.strerror or res}{hint}", path=path, index=index)
        err.__cause__ = res.with_traceback(None)
        return err
    if (res[1] if isinstance(res, tuple) else len(res)) == 0:
        return ReadError(f"empty {what}", path=path, index=index)
    return res

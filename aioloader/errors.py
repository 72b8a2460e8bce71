"""The exceptions aioloader raises.

One hierarchy; catch :class:`LoaderError` to catch everything the loader itself raises::

    LoaderError                  base class of every aioloader error
    ├── LoaderClosedError        the loader was used after close()/aclose()
    ├── SampleError              one sample failed (.path, .index)
    │   ├── ReadError            reading the file failed (missing, permission, empty, I/O)
    │   ├── DecodeError          decode raised in a worker, or killed its worker twice
    │   └── LoaderTimeoutError   a read or decode outlived sample_timeout
    └── WorkerCrashedError       decode workers could not start, or crashed past max_worker_restarts

Bad constructor arguments are plain ``ValueError``/``TypeError`` whose message shows the
value (``batch_size=0 must be a positive integer``). A :class:`SampleError` chains the
original exception (``__cause__``); a :class:`DecodeError` also carries the worker's
traceback text in ``.worker_traceback`` and in its message.
"""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "LoaderClosedError",
    "LoaderError",
    "LoaderTimeoutError",
    "ReadError",
    "SampleError",
    "WorkerCrashedError",
]


class LoaderError(Exception):
    """Base class of every error aioloader raises."""


class LoaderClosedError(LoaderError):
    """The loader was used after ``close()`` or ``aclose()``."""


class SampleError(LoaderError):
    """One sample could not be produced.

    ``path`` is the file, ``index`` its position in the dataset. The loader stays usable
    after raising it: the next iteration starts cleanly.
    """

    def __init__(self, message: str, *, path: str, index: int) -> None:
        super().__init__(f"{message} (sample {index}: {path!r})")
        self.path = path
        self.index = index

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling of exceptions.
        # The instance dict carries extra attributes (DecodeError.worker_traceback).
        return (_rebuild_sample_error, (type(self), self.args[0], self.path, self.index), self.__dict__)


def _rebuild_sample_error(cls: type[SampleError], full_message: str, path: str, index: int) -> SampleError:
    err = cls.__new__(cls)
    Exception.__init__(err, full_message)
    err.path = path
    err.index = index
    return err


class ReadError(SampleError):
    """Reading a file failed: missing, unreadable, empty, or an I/O error."""


class DecodeError(SampleError):
    """The decode function raised in a worker process, or the sample killed its worker
    twice (a poison sample); with ``ImageDecoder(device=...)``, also a JPEG that neither the
    device nor Pillow could decode.

    ``worker_traceback`` is the formatted traceback from the worker; the original
    exception (same type and message) is the ``__cause__``.
    """

    worker_traceback: str = ""


class LoaderTimeoutError(SampleError):
    """Reading or decoding one sample took longer than ``sample_timeout`` seconds."""


class WorkerCrashedError(LoaderError):
    """The decode worker processes are gone for good: they could not be started, or one
    died (a signal, ``os._exit``) after the pool was already rebuilt ``max_worker_restarts``
    times over the loader's life. A crash before that only rebuilds the pool (counted in
    ``stats.worker_restarts``). It ends the loader whatever ``on_error`` says."""

"""The exceptions aioloader raises.

One hierarchy; catch :class:`LoaderError` to catch everything the loader itself raises::

    LoaderError                  base class of every aioloader error
    ├── LoaderClosedError        the loader was used after close()/aclose()
    ├── SampleError              one sample failed (.path, .index; .member inside a tar)
    │   ├── ReadError            reading the file failed (missing, permission, empty, I/O)
    │   ├── DecodeError          decode raised in a worker, or killed its worker twice
    │   └── LoaderTimeoutError   a read or decode outlived sample_timeout
    ├── CollateError             collate raised on a batch (.batch, .paths)
    └── WorkerCrashedError       decode workers could not start, or crashed past max_worker_restarts

Bad constructor arguments are plain ``ValueError``/``TypeError`` whose message shows the
value (``batch_size=0 must be a positive integer``). A :class:`SampleError` chains the
original exception (``__cause__``); its first line (``.summary``) says what happened and
names the sample, and is what a skipped sample's WARNING shows. A :class:`DecodeError` also
carries the worker's traceback text in ``.worker_traceback``, shown once in its message
after that line; one that reaches the trainer under ``on_error="raise"`` ends with a line
saying that ``on_error="skip"`` exists (``.hint``).
"""

from __future__ import annotations

__all__ = [
    "CollateError",
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

    ``path`` is the file, ``index`` its position in the dataset, ``member`` the member of a
    tar shard it is (``FileDataset.from_tars``) or None. The loader stays usable
    after raising it: the next iteration starts cleanly.
    """

    #: A line for whoever reads the error, after its message (what to do about it); set
    #: when the loader raises it to the trainer.
    hint: str = ""

    #: The tar member the sample is (``FileDataset.member``), or None: not in a tar.
    member: str | None = None

    def __init__(self, message: str, *, path: str, index: int) -> None:
        super().__init__(f"{message} (sample {index}: {path!r})")
        self.path = path
        self.index = index

    def name_member(self, member: str) -> None:
        """Name the sample's tar member in the message too: ``(sample 7: 'x.tar', member
        'abc.jpg')``."""
        text, tail = str(self.args[0]), f"(sample {self.index}: {self.path!r})"
        if self.member is None and text.endswith(tail):
            self.args = (f"{text[:-1]}, member {member!r})", *self.args[1:])
        self.member = member

    @property
    def summary(self) -> str:
        """What happened and to which sample, without tracebacks or hints (one line when
        the cause's message is)."""
        return str(self.args[0])

    def _details(self) -> str:
        return ""

    def __str__(self) -> str:
        hint = f"\n{self.hint}" if self.hint else ""
        return f"{self.summary}{self._details()}{hint}"

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

    ``worker_traceback`` is the formatted traceback from the worker (``where``: the kind of
    process it ran in); the original exception (same type and message) is the ``__cause__``.
    """

    worker_traceback: str = ""
    where: str = "worker"

    def _details(self) -> str:
        if not self.worker_traceback:
            return ""
        return f"\n--- {self.where} traceback ---\n{self.worker_traceback.rstrip()}"


class LoaderTimeoutError(SampleError):
    """Reading or decoding one sample took longer than ``sample_timeout`` seconds."""


class CollateError(LoaderError):
    """``collate`` (yours, or the default) raised on batch ``batch``; its exception is the
    ``__cause__``. ``paths`` are the files the message names: for samples of different
    shapes, those of each shape (the odd ones out first); otherwise empty."""

    def __init__(self, message: str, *, batch: int, paths: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.batch = batch
        self.paths = paths

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling of exceptions.
        return (_rebuild_collate_error, (self.args[0], self.batch, self.paths), self.__dict__)


def _rebuild_collate_error(message: str, batch: int, paths: tuple[str, ...]) -> CollateError:
    return CollateError(message, batch=batch, paths=paths)


class WorkerCrashedError(LoaderError):
    """The decode worker processes are gone for good: they could not be started, or one
    died (a signal, ``os._exit``) after the pool was already rebuilt ``max_worker_restarts``
    times over the loader's life. A crash before that only rebuilds the pool (counted in
    ``stats.worker_restarts``). It ends the loader whatever ``on_error`` says."""

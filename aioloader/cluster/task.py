"""What runs on the Ray cluster: one task decodes one chunk of a batch.

:func:`decode_task` gets the chunk's samples as ``(row, dataset index, bytes or URL)``,
reads the URLs itself (with the loader's ``storage_options``, on an event loop this worker
process keeps), and decodes each sample with the loader's ``decode`` exactly as a local
worker does (:func:`aioloader.decode.worker.decode_chunk`: ``sample_rng`` seeded by
``(seed, epoch, index)``, failures returned as data with the traceback). It never raises
for a sample: a read that failed comes back as its ``OSError`` (or a :class:`Fatal` for one
that stops the loader: refused credentials), a decode past ``sample_timeout`` as
:class:`TimedOut`.

The decode function arrives once per worker process and loader: the task carries an
``ObjectRef`` to its pickled bytes (inside a list, so Ray does not fetch it for every task),
and this process keeps what it loaded under the loader's token.

A decode past ``sample_timeout`` is stopped by ``SIGALRM``, whose handler raises
:class:`_Expired` (a ``BaseException``, so the user's ``except Exception`` does not swallow
it): that interrupts Python code and sleeps. A decode stuck in C code that holds the GIL is
stopped by the loader instead, which cancels the task with ``force=True`` (see
:mod:`aioloader.cluster.faults`).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aioloader.base import sendable
from aioloader.decode.chunk import Chunk
from aioloader.decode.worker import decode_chunk
from aioloader.errors import LoaderError
from aioloader.memory.results import RowResult, Shrunk
from aioloader.read.outcomes import TRANSIENT, backoff

__all__ = ["Answer", "Fatal", "Reading", "TimedOut", "decode_task"]

#: What one sample became: a local worker's result, its read's error, or a timeout.
Outcome = Any  # RowResult | OSError | TimedOut | Fatal

_decoders: dict[str, Callable[[bytes], Any]] = {}
_MAX_DECODERS = 8


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The decode ran past ``sample_timeout`` and was interrupted."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Fatal:
    """A read error that stops the whole loader (refused credentials, no endpoint)."""

    message: str


@dataclass(frozen=True, slots=True)
class Reading:
    """How the task reads URLs: the loader's ``storage_options`` (credentials: never shown)
    and ``read_retries``."""

    storage_options: Mapping[str, Any] | None
    retries: int

    def __repr__(self) -> str:
        return f"Reading(retries={self.retries})"


@dataclass(frozen=True, slots=True)
class Answer:
    """A task's answer: one outcome per sample, in the chunk's order; the seconds the task
    spent reading URLs and decoding (the rest of the round trip is Ray's: scheduling and
    moving the bytes); the read retries it made; and the bytes of the
    URLs it read (the loader's ``stats.bytes_read``)."""

    outcomes: list[Outcome]
    read_seconds: float
    decode_seconds: float
    retries: int
    bytes_read: int = 0


class _Expired(BaseException):
    pass


def decode_task(
    box: list[Any],
    token: str,
    items: list[tuple[int, int, bytes | str]],
    seed: int,
    epoch: int,
    timeout: float | None,
    reading: Reading | None,
) -> Answer:
    """Decode one chunk (see the module docstring). ``box`` holds the ``ObjectRef`` of the
    pickled ``decode``; ``token`` names the loader it belongs to."""
    decode = _decoder(box, token)
    t0 = time.perf_counter()
    outcomes: list[Outcome] = [None] * len(items)
    retries = 0
    urls = [(i, src) for i, (_, _, src) in enumerate(items) if isinstance(src, str)]
    got: dict[int, bytes] = {}
    if urls:
        if reading is None:
            raise RuntimeError("a URL came without a way to read it")
        read, retries = _read_urls([u for _, u in urls], reading)
        for (i, _), res in zip(urls, read, strict=True):
            if isinstance(res, bytes):
                got[i] = res
            else:
                outcomes[i] = res
    t1 = time.perf_counter()
    nbytes = sum(len(b) for b in got.values())
    for i, (row, index, src) in enumerate(items):
        if outcomes[i] is not None:
            continue
        data = got.pop(i) if isinstance(src, str) else src
        outcomes[i] = _decode_one(decode, Chunk(None, None, [(row, index, data)], seed, epoch), timeout)
    return Answer(outcomes, t1 - t0, time.perf_counter() - t1, retries, nbytes)


def _plain(res: RowResult | Shrunk) -> RowResult:
    assert not isinstance(res, Shrunk), "a Ray task's chunk asks for no downscale"
    return res


def _decode_one(decode: Callable[[bytes], Any], chunk: Chunk, timeout: float | None) -> RowResult | TimedOut:
    if timeout is None or threading.current_thread() is not threading.main_thread():
        return _plain(decode_chunk(None, chunk, decode)[0])
    started = time.perf_counter()

    def expire(signum: int, frame: Any) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return _plain(decode_chunk(None, chunk, decode)[0])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        return TimedOut(time.perf_counter() - started)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _decoder(box: list[Any], token: str) -> Callable[[bytes], Any]:
    decode = _decoders.get(token)
    if decode is None:
        import ray

        decode = sendable.loads(ray.get(box[0]), "decode")
        while len(_decoders) >= _MAX_DECODERS:  # loaders come and go; keep the recent ones
            _decoders.pop(next(iter(_decoders)))
        _decoders[token] = decode
    return decode


# --- URLs, read on an event loop this worker process keeps -----------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_stores: dict[int, Any] = {}
_lock = threading.Lock()


def _read_urls(urls: list[str], reading: Reading) -> tuple[list[bytes | OSError | Fatal], int]:
    loop = _reader_loop()
    key = _options_key(reading)
    fut = asyncio.run_coroutine_threadsafe(_read_all(key, urls, reading), loop)
    return fut.result()


def _options_key(reading: Reading) -> int:
    return hash(repr(sorted((k, repr(v)) for k, v in (reading.storage_options or {}).items())))


def _reader_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="aioloader-cluster-read", daemon=True).start()
            _loop = loop
        return _loop


async def _read_all(key: int, urls: list[str], reading: Reading) -> tuple[list[bytes | OSError | Fatal], int]:
    from aioloader.read.remote import RemoteStore

    store = _stores.get(key)
    if store is None:
        store = _stores[key] = RemoteStore(reading.storage_options, max(64, len(urls)), "fsspec")
    tries = [0]

    async def one(url: str) -> bytes | OSError | Fatal:
        attempt = 0
        while True:
            try:
                return bytes(await store.cat(url))
            except LoaderError as exc:
                return Fatal(str(exc))
            except OSError as exc:
                if exc.errno in TRANSIENT and attempt < reading.retries:
                    attempt += 1
                    tries[0] += 1
                    await asyncio.sleep(backoff(attempt))
                    continue
                return OSError(exc.errno or errno.EIO, exc.strerror or str(exc))

    results = await asyncio.gather(*(one(u) for u in urls))
    return list(results), tries[0]

"""Reads of object storage and HTTP: ``s3://``, ``gs://``, ``az://``, ``http(s)://`` URLs,
awaited on the loader's own event loop through an asynchronous client: obstore for ``s3://``
and ``http(s)://`` where it can serve, else fsspec's asynchronous filesystems (s3fs on
aiobotocore, gcsfs, adlfs, aiohttp); :mod:`aioloader.read.backends` says which and why.
Thousands of reads in flight cost coroutines and pooled connections, not a thread each.
Needs ``pip install 'aioloader[remote]'``.

What a failed read becomes (``DESIGN.md``, "Remote storage"):

- throttling (HTTP 429/500/502/503/504, S3 SlowDown), timeouts, connection resets and a body
  cut short: :class:`RemoteReadError` with ``errno.EAGAIN``, so the reader tries again with
  backoff (``read_retries``, counted in ``stats.read_retries``);
- a missing object (404) or a per-object AccessDenied (403): :class:`RemoteReadError` with
  ``ENOENT``/``EACCES``, a :class:`~aioloader.ReadError` naming the URL, subject to
  ``on_error``;
- refused credentials, an endpoint that cannot be reached before any read of it
  succeeded, or settings with which the client can send no request: one
  :class:`~aioloader.LoaderError` that stops the loader, whatever ``on_error`` says.

Credentials never appear in what this module raises or logs: URLs are shown by
:func:`~aioloader.read.urls.redact` (no user info, no signature or token in the query), and
``storage_options`` are never formatted.
"""

from __future__ import annotations

import asyncio
import errno
import re
from collections.abc import Mapping
from typing import Any

from aioloader.base.threads import run_apart
from aioloader.errors import LoaderError
from aioloader.read.backends import (
    Backend,
    FsspecBackend,
    ObstoreBackend,
    StorageBackend,
    choose,
)
from aioloader.read.urls import options_for, redact, scheme

__all__ = ["RemoteReadError", "RemoteStore", "list_folder"]

_THROTTLED = {429, 500, 502, 503, 504}
_BAD_CREDENTIALS = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthFailure",
    "InvalidClientTokenId",
)
#: obstore puts the HTTP status in its message, not in an attribute.
_STATUS_TEXT = re.compile(r"status code: (\d{3})")
#: obstore's (reqwest's) words for a connection that failed after it was made: try again.
_TRANSPORT_WORDS = (
    "body error",
    "IncompleteBody",
    "Interrupted",
    "ConnectionReset",
    "connection reset",
    "TimedOut",
    "timed out",
    "error sending request",
)
#: obstore's (reqwest's) words for a request its client refused to build (an http:// URL
#: where HTTP is not allowed, a malformed endpoint): no request of this client can be sent.
_CLIENT_REFUSED = ("builder error", "BadScheme")
_THROTTLE_WORDS = ("SlowDown", "Throttl", "ServiceUnavailable", "RequestTimeout", "InternalError")


class RemoteReadError(OSError):
    """A remote read that failed for this sample (``errno``: ``EAGAIN`` worth another try,
    ``ENOENT`` missing, ``EACCES`` refused); the message names nothing secret."""


class RemoteStore:
    """The clients of one loader, one per protocol (see :mod:`aioloader.read.backends`), made on
    first use on the loader's loop and closed by :meth:`aclose`; their connection pools hold
    ``io_concurrency`` connections and live across epochs."""

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None,
        io_concurrency: int,
        backend: StorageBackend = "auto",
    ) -> None:
        self._options = storage_options
        self._io = io_concurrency
        self._preference: StorageBackend = backend
        self._backends: dict[str, Backend] = {}
        self._ok: set[str] = set()  # protocols with a successful read: their endpoint is up
        self._checks: dict[tuple[str, str], asyncio.Future[None]] = {}  # (protocol, bucket)

    def backend(self, protocol: str, query: bool = False) -> Backend:
        """The client for ``protocol`` (made on first use, on the running loop); for a URL
        with a query string (a presigned URL) always fsspec's, which sends it as it is."""
        key = f"{protocol}?" if query else protocol
        got = self._backends.get(key)
        if got is not None:
            return got
        opts = options_for(self._options, protocol)
        made: Backend
        if not query and choose(protocol, opts, self._preference) == "obstore":
            made = ObstoreBackend(protocol, opts, self._io)
        else:
            made = FsspecBackend(protocol, opts, self._io)
        self._backends[key] = made
        return made

    async def cat(self, url: str, start: int | None = None, end: int | None = None) -> Any:
        """The object at ``url`` (bytes ``start`` to ``end``, exclusive, when given), as
        ``bytes`` or another buffer of bytes. Raises :class:`RemoteReadError` for this
        sample, or :class:`LoaderError` when no read can succeed (see the module docstring)."""
        protocol = scheme(url) or "file"
        client = self.backend(protocol, query="?" in url)
        if protocol in ("s3", "s3a"):
            await self._check_bucket(client, protocol, url)
        try:
            data = await client.cat(url, start, end)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - classified below
            raise self._classify(exc, url, protocol) from None
        self._ok.add(protocol)
        return data

    async def head(self, url: str) -> tuple[int, str]:
        """The object's ``(size, version)`` (:meth:`Backend.head`), one request without the
        body; raises as :meth:`cat` does."""
        protocol = scheme(url) or "file"
        client = self.backend(protocol, query="?" in url)
        if protocol in ("s3", "s3a"):
            await self._check_bucket(client, protocol, url)
        try:
            return await client.head(url)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - classified below
            raise self._classify(exc, url, protocol) from None

    async def _check_bucket(self, client: Backend, protocol: str, url: str) -> None:
        """Once per bucket, before its first read: one listing of at most one key, whose
        answer (unlike a HEAD's) says why it was refused. Refused credentials or an
        unreachable endpoint stop the loader here, once, with one :class:`LoaderError`;
        anything else (no permission to list, no such bucket) is left to the reads."""
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        key = (protocol, bucket)
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = asyncio.ensure_future(self._list_one(client, protocol, url, bucket))
        await asyncio.shield(check)

    async def _list_one(self, client: Backend, protocol: str, url: str, bucket: str) -> None:
        try:
            await client.list_one(url, bucket)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - classified below
            err = self._classify(exc, url, protocol)
            if isinstance(err, LoaderError):
                raise err from None

    def _classify(self, exc: BaseException, url: str, protocol: str) -> BaseException:
        if isinstance(exc, LoaderError):  # the backend already said the loader cannot go on
            return exc
        shown = redact(url)
        text = _chain_text(exc)
        if any(word in text for word in _BAD_CREDENTIALS):
            code = next(word for word in _BAD_CREDENTIALS if word in text)
            return LoaderError(f"the credentials for {protocol}:// were refused ({code}) reading {shown}")
        if isinstance(exc, TypeError):  # the client refused an option: every read would
            return LoaderError(
                f"the {protocol}:// filesystem cannot be used with these storage_options ({exc}); "
                f"options for several protocols go in a dict per protocol: {{{protocol!r}: {{...}}}}"
            )
        if any(word in text for word in _CLIENT_REFUSED):  # so would every request
            return LoaderError(
                f"the {protocol}:// client cannot send a request to the endpoint of {shown} "
                f"(its settings are refused: {type(exc).__name__})"
            )
        status = getattr(exc, "status", None)
        if status is None and (found := _STATUS_TEXT.search(text)) is not None:
            status = int(found.group(1))
        name = type(exc).__name__
        if isinstance(exc, FileNotFoundError) or status == 404 or name == "NotFoundError":
            return RemoteReadError(errno.ENOENT, "not found (404)")
        if isinstance(exc, PermissionError) or status == 403 or name == "PermissionDeniedError":
            return RemoteReadError(errno.EACCES, "access denied (403)")
        if isinstance(status, int) and status in _THROTTLED:
            return RemoteReadError(errno.EAGAIN, f"the server answered {status}")
        if any(word in text for word in _THROTTLE_WORDS):
            return RemoteReadError(errno.EAGAIN, "throttled or unavailable")
        if _unreachable(exc) and protocol not in self._ok:
            return LoaderError(
                f"cannot reach the {protocol}:// endpoint reading {shown}: {type(exc).__name__}"
            )
        transport = any(word in text for word in _TRANSPORT_WORDS)
        if (
            isinstance(exc, (asyncio.TimeoutError, ConnectionError, OSError))
            or _is_client_error(exc)
            or transport
        ):
            return RemoteReadError(errno.EAGAIN, f"connection failed: {type(exc).__name__}")
        return RemoteReadError(errno.EIO, f"read failed: {type(exc).__name__}")

    async def aclose(self) -> None:
        """Close every filesystem's connections (on the loader's loop, before it stops)."""
        for check in self._checks.values():
            check.cancel()
        self._checks.clear()
        clients, self._backends = list(self._backends.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing must not fail a shutdown
                pass


def _chain_text(exc: BaseException) -> str:
    """The type, text and error codes of ``exc`` and what it was raised from (s3fs turns
    botocore's ``ClientError``, which has the code, into a bare ``PermissionError``)."""
    parts: list[str] = []
    at: BaseException | None = exc
    for _ in range(5):
        if at is None:
            break
        response = getattr(at, "response", None)
        code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
        parts.append(f"{type(at).__name__}: {at} {code}")
        at = at.__cause__ or at.__context__
    return " | ".join(parts)


def _unreachable(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return (
        bool(names & {"ClientConnectorError", "EndpointConnectionError", "ConnectTimeoutError"})
        or isinstance(exc, ConnectionRefusedError)
        # obstore (reqwest): no connection could be made (refused, no such host)
        or any(word in str(exc) for word in ("tcp connect error", "ConnectionRefused", "dns error"))
    )


def _is_client_error(exc: BaseException) -> bool:
    """aiohttp's and botocore's transport errors (disconnects, short payloads)."""
    return any(
        c.__name__ in ("ClientError", "ClientPayloadError", "ServerDisconnectedError", "HTTPClientError")
        for c in type(exc).__mro__
    )


def list_folder(
    root: str, storage_options: Mapping[str, Any] | None, concurrent: bool = True
) -> dict[str, list[str]]:
    """``{class: its object URLs}`` for the ImageFolder layout ``root/<class>/**`` in object
    storage: the class prefixes are listed concurrently (each listing paginated by the
    backend), or one after another with ``concurrent=False``. Hidden names (``.x``) are
    left out at every level. Runs its own event loop on a thread of its own, so it works
    inside a running loop too."""
    protocol = scheme(root) or "file"
    if protocol in ("http", "https"):
        raise ValueError(f"from_folder: {redact(root)} cannot be listed (HTTP has no listing)")
    out: dict[str, list[str]] = {}

    async def main() -> None:
        # Listing has no retry loop of its own: the client's retries stay on.
        client = FsspecBackend(protocol, options_for(storage_options, protocol), 64, own_retries=True)
        try:
            fs = client.fs
            if hasattr(fs, "set_session"):
                await fs.set_session()
            base = root.rstrip("/")
            entries = await fs._ls(base, detail=True)
            classes = sorted(
                e["name"].rstrip("/").rsplit("/", 1)[-1]
                for e in entries
                if e.get("type") == "directory"
                and not e["name"].rstrip("/").rsplit("/", 1)[-1].startswith(".")
            )

            async def find(name: str) -> list[str]:
                found = await fs._find(f"{base}/{name}")
                keep = []
                for key in sorted(found):
                    rel = key.split(f"/{name}/", 1)[-1]
                    if any(part.startswith(".") for part in rel.split("/")):
                        continue
                    keep.append(key if scheme(key) else f"{protocol}://{key}")
                return keep

            if concurrent:
                lists = await asyncio.gather(*(find(c) for c in classes))
            else:
                lists = [await find(c) for c in classes]
            out.update(zip(classes, lists, strict=True))
        finally:
            await client.aclose()

    run_apart(main, "aioloader-list")
    return out

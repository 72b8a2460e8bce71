"""The clients behind :class:`~aioloader.read.remote.RemoteStore`, one per protocol of a loader:

- :class:`FsspecBackend`: fsspec's asynchronous filesystems (s3fs on aiobotocore, gcsfs,
  adlfs, aiohttp for HTTP), awaited on the loader's loop. Serves every protocol fsspec knows.
- :class:`ObstoreBackend`: obstore (Rust's ``object_store`` on its own tokio threads), for
  ``s3://`` and ``http(s)://``. It serves more reads per second than aiohttp (1.3x at 256
  in flight, 1.7x at a thousand) for about the same CPU per read (``benchmarks/RESULTS.md``
  §13a).

:func:`choose` picks one: ``storage_backend="auto"`` takes obstore where it is installed,
serves the protocol, every storage option has an obstore name, and for S3 obstore can read
as botocore would (:func:`~aioloader.read.urls.s3_unsupported` says where not: then fsspec).

Both keep one fault contract (``DESIGN.md``, "Remote storage"), so obstore's ``S3Store`` is
not let settle the environment on its own: it lays the options over every ``AWS_*`` variable
one by one, and so signed the options' key with the environment's ``AWS_SESSION_TOKEN``
(InvalidToken), read from ``AWS_ENDPOINT_URL_S3`` over the options' endpoint, and, given
client options of ours, dropped ``AWS_ALLOW_HTTP`` (an ``http://`` endpoint of the
environment's failed every read: "builder error"). The store is given what botocore would
use (:func:`~aioloader.read.urls.s3_settings`): the credentials through a provider of
them alone, the endpoint under both of obstore's names, obstore-only switches off.

obstore runs only in a loader process (``loader_process="auto"``, the default, or True): its
tokio runtime, threads and epoll descriptors, lives until its process exits, so in the
trainer's process it would outlive ``close()``; the loader process ends with it.
:func:`resolve` settles this when the loader is made, and a loader that ends up in-process
all the same (no zygote could be made) reads with fsspec (:mod:`aioloader.run.start`). A
loader process forked after the trainer started a tokio runtime of its own would inherit
the runtime without its threads (a hang), so then fsspec it is.

Both raise their client's own errors; :class:`~aioloader.read.remote.RemoteStore` classifies
them. Neither retries on its own: the reader's retries are the ones counted in ``stats``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aioloader.errors import LoaderError
from aioloader.read.urls import FSSPEC_PACKAGES, s3_settings, s3_unsupported

if TYPE_CHECKING:
    from obstore.store import S3Credential

__all__ = [
    "Backend",
    "FsspecBackend",
    "ObstoreBackend",
    "StorageBackend",
    "choose",
    "obstore_kwargs",
    "resolve",
    "tokio_started",
]

StorageBackend = Literal["auto", "fsspec", "obstore"]
OBSTORE_PROTOCOLS = frozenset({"s3", "s3a", "http", "https"})
#: fsspec's (s3fs's) names -> obstore's S3 names.
_S3_NAMES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}
_S3_CLIENT_NAMES = {"region_name": "region", "endpoint_url": "endpoint"}
_POOL = {"max_pool_connections"}  # obstore's pool grows to what is in flight


class Backend(Protocol):
    async def cat(self, url: str, start: int | None, end: int | None) -> Any:
        """The object's bytes (``start`` to ``end``, exclusive, when given), as a buffer."""

    async def head(self, url: str) -> tuple[int, str]:
        """The object's size and version (its ETag, else its last modification), one request
        without the body; the version is ``""`` where the server gives neither."""

    async def list_one(self, url: str, bucket: str) -> None:
        """One listing of at most a page of keys in ``bucket``: raises why it is refused."""

    async def aclose(self) -> None: ...


def tokio_started() -> bool:
    """Whether this process runs tokio threads (obstore's, or another Rust extension's)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(("tokio-runtime", "tokio-rt")):
                    return True
        except OSError:
            continue
    return False


def resolve(preference: object, loader_process: bool) -> StorageBackend:
    """``storage_backend`` as the loader will use it (see the module docstring), for a
    loader that starts in a loader process (``loader_process``) or in-process; raises
    ``ValueError`` for a value it does not know or obstore without a loader process."""
    if preference not in ("auto", "fsspec", "obstore"):
        raise ValueError(f"storage_backend={preference!r} must be 'auto', 'fsspec' or 'obstore'")
    if preference == "obstore" and not loader_process:
        raise ValueError(
            "storage_backend='obstore' needs a loader process (loader_process='auto' or True): "
            "obstore's runtime (threads, epoll descriptors) lives until its process exits, and "
            "the loader process ends with close()"
        )
    if preference == "obstore":
        return "obstore"
    if preference == "auto" and loader_process and not tokio_started():
        return "auto"
    return "fsspec"


def _install_hint(protocol: str, package: str | None) -> str:
    if package in ("s3fs", "aiohttp", "obstore"):
        return "pip install 'aioloader[remote]'"
    if package is not None:
        return f"pip install 'aioloader[remote]' {package}"
    return "an fsspec filesystem for it (see fsspec's list of implementations)"


class FsspecBackend:
    """One fsspec asynchronous filesystem, made on the running loop; its connection pool
    holds ``io_concurrency`` connections (botocore's default of 10 and aiohttp's of 100
    would cap ``io_concurrency`` silently). Unless ``own_retries`` (listing), s3fs and
    botocore try once: the reader's retries are the counted ones."""

    def __init__(
        self, protocol: str, options: dict[str, Any], io_concurrency: int, own_retries: bool = False
    ) -> None:
        try:
            import fsspec
        except ImportError as exc:
            hint = _install_hint(protocol, FSSPEC_PACKAGES.get(protocol))
            raise LoaderError(f"reading {protocol}:// URLs needs fsspec: {hint}") from exc
        opts = dict(options)
        if protocol in ("s3", "s3a"):
            config = dict(opts.pop("config_kwargs", None) or {})
            config.setdefault("max_pool_connections", io_concurrency)
            if not own_retries:
                # One try each in botocore and in s3fs: the reader retries, with backoff, and
                # counts every retry in stats.read_retries (DESIGN.md, "Remote storage").
                config.setdefault("retries", {"total_max_attempts": 1})
            opts["config_kwargs"] = config
        elif protocol in ("http", "https"):
            try:
                import aiohttp
            except ImportError as exc:
                raise LoaderError(
                    "reading http(s):// URLs needs aiohttp: pip install 'aioloader[remote]'"
                ) from exc
            client = dict(opts.pop("client_kwargs", None) or {})
            client.setdefault(
                "connector", aiohttp.TCPConnector(limit=io_concurrency, limit_per_host=io_concurrency)
            )
            opts["client_kwargs"] = client
        try:
            self.fs = fsspec.filesystem(
                "s3" if protocol == "s3a" else protocol,
                asynchronous=True,
                loop=asyncio.get_running_loop(),
                skip_instance_cache=True,
                **opts,
            )
        except ImportError as exc:
            raise LoaderError(
                f"reading {protocol}:// URLs needs {_install_hint(protocol, FSSPEC_PACKAGES.get(protocol))}"
            ) from exc
        except ValueError as exc:  # fsspec: "Protocol not known"
            raise LoaderError(f"no fsspec filesystem reads {protocol}:// URLs: {exc}") from None
        if protocol in ("s3", "s3a") and not own_retries and hasattr(self.fs, "retries"):
            self.fs.retries = 1  # s3fs's own loop (a class attribute, not an option)
        # s3fs asks for an object's size (a HEAD) before reading it whole, to split big
        # objects over several requests: one request per sample is what a sample needs.
        cat = getattr(self.fs, "_cat_file", None)
        params = inspect.signature(cat).parameters if cat is not None else {}
        self._whole: dict[str, Any] = {"max_concurrency": 1} if "max_concurrency" in params else {}

    async def cat(self, url: str, start: int | None, end: int | None) -> Any:
        if start is None:
            return await self.fs._cat_file(url, **self._whole)
        return await self.fs._cat_file(url, start=start, end=end)

    async def head(self, url: str) -> tuple[int, str]:
        info = await self.fs._info(url)
        # s3fs: ETag, LastModified; HTTP: the response's ETag or Last-Modified header.
        names = ("ETag", "LastModified", "Last-Modified", "last_modified")
        tag = next((info[n] for n in names if info.get(n)), "")
        return int(info["size"]), str(tag)

    async def list_one(self, url: str, bucket: str) -> None:
        call = getattr(self.fs, "_call_s3", None)
        if call is not None:  # s3fs
            await call("list_objects_v2", Bucket=bucket, MaxKeys=1)

    async def aclose(self) -> None:
        s3 = getattr(self.fs, "_s3", None)
        if s3 is not None:  # s3fs: the aiobotocore client
            await s3.__aexit__(None, None, None)
            return
        session = getattr(self.fs, "_session", None)
        if session is not None:  # HTTPFileSystem: the aiohttp session
            await session.close()


def obstore_kwargs(protocol: str, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """``options`` (fsspec's names) as obstore store arguments, or None where one of them
    has no obstore name (the caller then uses fsspec)."""
    out: dict[str, Any] = {}
    if protocol in ("http", "https"):
        for name, value in options.items():
            if name == "client_kwargs" and set(value) <= {"headers"}:
                if value.get("headers"):
                    out["default_headers"] = dict(value["headers"])
            else:
                return None
        return out
    for name, value in options.items():
        if name in _S3_NAMES:
            out[_S3_NAMES[name]] = value
        elif name == "endpoint_url":
            out["endpoint"] = value
        elif name == "anon":
            out["skip_signature"] = bool(value)
        elif name == "client_kwargs" and isinstance(value, Mapping) and set(value) <= set(_S3_CLIENT_NAMES):
            out.update({_S3_CLIENT_NAMES[k]: v for k, v in value.items()})
        elif name == "config_kwargs" and isinstance(value, Mapping) and set(value) <= _POOL:
            pass
        else:
            return None
    return out


def _aws_profile(env: Mapping[str, str]) -> bool:
    """Whether botocore would read an AWS profile: ``AWS_PROFILE``, or config files."""
    home = env.get("HOME") or os.path.expanduser("~")
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
        env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
    )
    return bool(env.get("AWS_PROFILE")) or any(os.path.exists(f) for f in files)


def _fixed(key: str, secret: str, token: str | None) -> Callable[[], S3Credential]:
    """obstore's credential provider for these credentials alone (with one, an ``S3Store``
    reads no key, secret or token of the environment's); no expiry: asked once."""
    credential: S3Credential = {
        "access_key_id": key,
        "secret_access_key": secret,
        "token": token,
        "expires_at": None,
    }
    return lambda: credential


def choose(
    protocol: str,
    options: dict[str, Any],
    preference: StorageBackend,
    environ: Mapping[str, str] | None = None,
) -> Literal["fsspec", "obstore"]:
    """Which backend reads ``protocol`` with these ``options`` in this ``environ``
    (``os.environ``; see the module docstring); ``preference="obstore"`` where obstore
    cannot serve is a :class:`LoaderError`."""
    if preference == "fsspec":
        return "fsspec"
    kwargs = obstore_kwargs(protocol, options) if protocol in OBSTORE_PROTOCOLS else None
    env = os.environ if environ is None else environ
    why = None
    if kwargs is not None and protocol in ("s3", "s3a"):
        why = s3_unsupported(kwargs, env, _aws_profile(env))
    try:
        import obstore  # noqa: F401
    except ImportError:
        installed = False
    else:
        installed = True
    if preference == "obstore":
        if not installed:
            raise LoaderError("storage_backend='obstore' needs obstore: pip install 'aioloader[remote]'")
        if kwargs is None:
            raise LoaderError(
                f"storage_backend='obstore' cannot read {protocol}:// URLs with these storage_options "
                f"(obstore serves s3:// and http(s):// with key, secret, token, endpoint_url, anon, "
                f"client_kwargs.region_name); use storage_backend='fsspec'"
            )
        if why is not None:
            raise LoaderError(
                f"storage_backend='obstore' cannot read {protocol}:// URLs as botocore would: {why}; "
                f"use storage_backend='fsspec' (or 'auto')"
            )
        return "obstore"
    if not installed or kwargs is None or why is not None:
        return "fsspec"
    return "obstore"


class ObstoreBackend:
    """obstore stores for one protocol, one per bucket (S3) or origin (HTTP), made on first
    use and kept for the loader's life (their connection pools with them). Retries are off
    in obstore: the reader retries and counts."""

    def __init__(self, protocol: str, options: dict[str, Any], io_concurrency: int) -> None:
        kwargs = obstore_kwargs(protocol, options)
        assert kwargs is not None  # choose() said so
        self._protocol = protocol
        self._kwargs = kwargs
        self._io = io_concurrency
        self._stores: dict[str, Any] = {}
        import obstore  # installed: choose() said so; imported once, not on every read

        self._ob: Any = obstore

    def _store(self, url: str) -> tuple[Any, str]:
        """The store for ``url`` and the object's path in it."""
        from obstore.store import HTTPStore, S3Store

        rest = url.split("://", 1)[1]
        root, _, path = rest.partition("/")
        store = self._stores.get(root)
        if store is None:
            # Any: obstore's TypedDicts (ClientConfig, RetryConfig) want literal keys
            client: Any = {"pool_max_idle_per_host": str(self._io)}
            retry: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=60)}
            if self._protocol in ("http", "https"):
                client["allow_http"] = True
                headers = self._kwargs.get("default_headers")
                if headers:
                    client["default_headers"] = headers
                store = HTTPStore.from_url(
                    f"{self._protocol}://{root}", client_options=client, retry_config=retry
                )
            else:
                # Settled as botocore would (module docstring), in this process's environment
                # as it is now. Our client options replace all obstore took from it
                # (AWS_ALLOW_HTTP among them); AWS_CA_BUNDLE's certificates are trusted
                # besides the system's (botocore trusts them alone).
                config: Any  # an S3Config
                try:
                    config, more, credentials = s3_settings(self._kwargs, os.environ)
                    client.update(more)
                    if bundle := os.environ.get("AWS_CA_BUNDLE"):
                        with open(bundle, "rb") as f:
                            client["root_certificate"] = f.read()
                    store = S3Store(
                        root,
                        config=config,
                        client_options=client,
                        retry_config=retry,
                        credential_provider=None if credentials is None else _fixed(*credentials),
                    )
                except Exception as exc:  # noqa: BLE001 - every read of the bucket would fail so
                    raise LoaderError(
                        f"obstore cannot make a store for s3://{root} with these settings: "
                        f"{type(exc).__name__}"
                    ) from None
            self._stores[root] = store
        return store, path

    async def cat(self, url: str, start: int | None, end: int | None) -> Any:
        store, path = self._store(url)
        if start is None:
            got = await self._ob.get_async(store, path)
            return await got.bytes_async()
        return await self._ob.get_range_async(store, path, start=start, end=end)

    async def head(self, url: str) -> tuple[int, str]:
        store, path = self._store(url)
        meta = await self._ob.head_async(store, path)
        modified = meta.get("last_modified")
        if modified is not None and modified.timestamp() == 0:
            modified = None  # obstore's stand-in where the server sent no Last-Modified (HTTP)
        tag = meta.get("e_tag") or modified or ""
        return int(meta["size"]), str(tag)

    async def list_one(self, url: str, bucket: str) -> None:
        store, _ = self._store(url)
        stream = self._ob.list(store, chunk_size=1)
        try:
            await stream.__anext__()
        except StopAsyncIteration:  # an empty bucket: allowed
            pass

    async def aclose(self) -> None:
        self._stores.clear()  # obstore's pools close when their stores are dropped

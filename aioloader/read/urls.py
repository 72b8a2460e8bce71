"""URLs and paths, as strings: which paths are URLs, their scheme, a ``file://`` URL as a
path, a URL fit for a log line (:func:`redact`), and the ``storage_options`` of one protocol.
No I/O: the reader, the dataset, the bench and the bottleneck's advice all ask these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from aioloader.read.backends import FSSPEC_PACKAGES

__all__ = ["is_remote", "local_path", "options_for", "redact", "scheme"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_SECRET_QUERY = re.compile(r"(sig|signature|token|key|credential|secret|password)", re.IGNORECASE)


def scheme(path: str) -> str | None:
    """The URL scheme of ``path`` in lower case (``'s3'``, ``'file'``), or None for a plain
    path."""
    if "://" not in path:  # the common case, on the read path: no regex for a plain path
        return None
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str) -> bool:
    """Whether ``path`` is read through :class:`~aioloader.read.remote.RemoteStore` (a URL other than ``file://``)."""
    s = scheme(path)
    return s is not None and s != "file"


def local_path(path: str) -> str:
    """``file:///a/b`` -> ``/a/b``; any other path unchanged."""
    return path[len("file://") :] if scheme(path) == "file" else path


def redact(url: str) -> str:
    """``url`` fit for a log line or an error: no ``user:password@``, and the values of
    query parameters that look like signatures, tokens or keys replaced by ``***``."""
    if not is_remote(url):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("?", 1)[0]
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def options_for(storage_options: Mapping[str, Any] | None, protocol: str) -> dict[str, Any]:
    """The options for ``protocol``: a dict keyed by protocol (``{"s3": {...}}``) gives that
    protocol's entry (``https`` falls back to ``http``), a flat dict applies to every
    protocol."""
    if not storage_options:
        return {}
    keyed = all(isinstance(v, Mapping) and k in FSSPEC_PACKAGES for k, v in storage_options.items())
    if keyed:
        entry = storage_options.get(protocol)
        if entry is None and protocol == "https":
            entry = storage_options.get("http")
        if entry is None and protocol == "s3a":
            entry = storage_options.get("s3")
        return dict(entry or {})
    return dict(storage_options)

"""URLs and paths, as strings: which paths are URLs, their scheme, a ``file://`` URL as a
path, a URL fit for a log line (:func:`redact`), the ``storage_options`` of one protocol,
and what S3's options and ``AWS_*`` variables come to where botocore settles them
(:func:`s3_settings`, for obstore, which would settle them otherwise). No I/O: the reader,
the dataset, the bench and the bottleneck's advice all ask these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "FSSPEC_PACKAGES",
    "is_remote",
    "local_path",
    "options_for",
    "redact",
    "s3_settings",
    "s3_unsupported",
    "scheme",
]

#: Schemes fsspec serves asynchronously, and the package that does it.
FSSPEC_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
}

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


#: obstore's read switches that botocore has no variable for: off, as botocore has them
#: (``AWS_SKIP_SIGNATURE`` and the like in the environment would turn them on).
_BOTOCORE_DEFAULTS = {
    "request_payer": False,
    "s3_express": False,
    "unsigned_payload": False,
    "virtual_hosted_style_request": False,
}
_CREDENTIALS = ("access_key_id", "secret_access_key", "session_token")


def _env_endpoint(env: Mapping[str, str]) -> str | None:
    """The endpoint botocore takes from ``env`` (the service's variable first), if any."""
    if env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def s3_unsupported(kwargs: Mapping[str, Any], env: Mapping[str, str], profile: bool) -> str | None:
    """Why obstore cannot read S3 as botocore would, given obstore ``kwargs`` (fsspec's
    options by obstore's names), environment variables ``env`` and whether an AWS profile
    is there to read (``profile``); None where it can. Where botocore would refuse half a
    key (PartialCredentialsError) that obstore would sign with; would read a profile's
    credentials, which obstore does not; would ignore an endpoint obstore would use
    (``AWS_ENDPOINT``, or any with ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``); would not send
    the ``AWS_SSE_CUSTOMER_KEY_BASE64`` that obstore would send with every read."""
    key, secret = kwargs.get("access_key_id"), kwargs.get("secret_access_key")
    env_key, env_secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not kwargs.get("skip_signature"):
        if (key is None) != (secret is None):
            return "storage_options give a key without a secret, or a secret without a key"
        if key is None and (env_key is not None or env_secret is not None) and not (env_key and env_secret):
            return "the environment gives AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY, or the reverse"
        if key is None and not env_key and profile:
            return "credentials would come from an AWS profile (config files), which obstore does not read"
    endpoints = ("AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    if not kwargs.get("endpoint") and not _env_endpoint(env) and any(env.get(n) for n in endpoints):
        return "the environment gives an endpoint that only obstore would use"
    if env.get("AWS_SSE_CUSTOMER_KEY_BASE64"):
        return "AWS_SSE_CUSTOMER_KEY_BASE64 is set: obstore would send it with every read, botocore not"
    return None


def s3_settings(
    kwargs: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, str, str | None] | None]:
    """``(config, client options, credentials)`` for an obstore ``S3Store`` from obstore
    ``kwargs`` and environment variables ``env``, settled as botocore settles them (where
    :func:`s3_unsupported` says it can be): a key and secret in the options are used whole,
    with the options' token or none, else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
    with ``AWS_SESSION_TOKEN`` (or ``AWS_SECURITY_TOKEN``); credentials None: anonymous
    (``anon``), or obstore's chain (container, web identity, instance). The endpoint: the
    options', else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, HTTP allowed where it
    is ``http://``. The region: the options', else obstore's (``AWS_REGION``,
    ``AWS_DEFAULT_REGION``). Holds secrets: never to be shown."""
    config = {k: v for k, v in kwargs.items() if k not in _CREDENTIALS}
    config.update(_BOTOCORE_DEFAULTS, skip_signature=bool(kwargs.get("skip_signature")))
    client: dict[str, Any] = {}
    endpoint = kwargs.get("endpoint") or _env_endpoint(env)
    if endpoint:
        # obstore prefers its service-specific name to ``endpoint``: both, so that no
        # AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL of the environment's wins over this one
        config["endpoint"] = config["aws_endpoint_url_s3"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            client["allow_http"] = True
    key, secret, token = (kwargs.get(name) for name in _CREDENTIALS)
    if config["skip_signature"]:
        return config, client, None
    if key is not None and secret is not None:
        return config, client, (str(key), str(secret), None if token is None else str(token))
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        token = env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN") or None
        return config, client, (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], token)
    return config, client, None

"""What names an entry and what an entry file holds (pure: no I/O).

**Key.** ``sha256(fingerprint, source, span, identity)``, 32 hex digits: the cache's
settings (:attr:`~aioloader.cache.settings.Cache.fingerprint`, the format's version in it),
the path or URL, the byte range of it a sample is, and the source's identity when read: its
size and modification time (``st_mtime_ns``) for a file, its size and ETag (else
Last-Modified) for an object. A changed source has another key: its old entry is never
found again.

**Entry file** (a disk cache): a 64-byte header, then the bytes::

    0   8 bytes  MAGIC  b"AIOLCCH\\x01"
    8   8 bytes  length of the bytes (little-endian)
    16  4 bytes  CRC-32 of the bytes
    20  12 bytes zero
    32  32 bytes the key (ASCII hex)

A file is served only when all of it checks: the magic, the key it is stored under, the
length against the file's size, the CRC against the bytes. Anything else (a write cut
short by a full disk, a file a power loss left half-written) is a miss, read again from the
source, and replaced.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

__all__ = ["HEADER", "MAGIC", "Identity", "check", "crc_ok", "entry_key", "header", "relpath"]

MAGIC = b"AIOLCCH\x01"
#: Bytes before an entry's data.
HEADER = 64
_FIXED = struct.Struct("<8sQI12x")

#: A source's identity when read: ``(size in bytes, version)``, where the version is the
#: file's ``st_mtime_ns`` or the object's ETag (or Last-Modified) as text.
Identity = tuple[int, str]


def entry_key(fingerprint: str, source: str, span: tuple[int, int] | None, identity: Identity) -> str:
    """The key of the entry for ``source`` (its ``span``: ``(offset, length)``, or None for
    all of it) as it is now (``identity``), under the settings ``fingerprint``."""
    h = hashlib.sha256()
    for part in (fingerprint, source, repr(span), str(identity[0]), identity[1]):
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def relpath(key: str) -> str:
    """Where the entry lies under the cache's folder: 256 sub-folders by the key's first
    two digits, so no folder holds millions of files."""
    return f"{key[:2]}/{key}"


def header(key: str, data: bytes | memoryview) -> bytes:
    """The header of ``data`` stored under ``key``."""
    return _FIXED.pack(MAGIC, len(data), zlib.crc32(data)) + key.encode("ascii")


def check(key: str, head: bytes, size: int) -> int | None:
    """The length of the data an entry file of ``size`` bytes starting with ``head`` holds,
    if its header is whole, for ``key`` and that size; None otherwise (the CRC is checked
    once the data is read: :func:`crc_ok`)."""
    if len(head) < HEADER:
        return None
    magic, length, _ = _FIXED.unpack_from(head)
    if magic != MAGIC or head[32:HEADER] != key.encode("ascii") or HEADER + length != size:
        return None
    return int(length)


def crc_ok(head: bytes, data: bytes | memoryview) -> bool:
    """Whether ``data`` has the CRC its header ``head`` says."""
    return int(_FIXED.unpack_from(head)[2]) == zlib.crc32(data)

"""A tar shard's index: its members' names, data offsets and sizes (and the text of its small
members: labels), read once, then kept.

Where an index comes from, first found (for a remote shard 2 before 1: the cache needs only
the HEAD that gives the identity, a sidecar one more request):

1. a **sidecar** ``<shard>.idx`` beside the shard (``aioloader index`` writes it);
2. the **index cache**, ``$AIOLOADER_CACHE/tars`` (else ``$XDG_CACHE_HOME/aioloader/tars``,
   else ``~/.cache/aioloader/tars``), keyed by the shard's address and identity: size and
   ``st_mtime_ns`` for a file, size and ETag (else Last-Modified) for an object, so a shard
   rewritten in place is scanned again; an object with neither is not cached;
3. a **scan**: a local shard header after header, ``pread``-style (a seek past each member's
   data; a member of at most :data:`SMALL` bytes is read, as a label may be in it); a remote
   one front to back in ranged GETs, a member over a megabyte passed over by a GET where the
   next header is (:mod:`aioloader.read.tarranges`). Shards are scanned concurrently
   (:data:`SCANS` at once). Measured each way (``benchmarks/tar_index.py``): on a local disk
   the seeks win 2x with the shard in the page cache and lose 1.6-3x cold against one pass
   (85 KB members), and win 50-100x with 10 MB members; over HTTP one pass wins 4-50x against
   a GET a member at 0-20 ms a request (85 KB members).

The index format (sidecar and cache alike), UTF-8 text, one member a line::

    aioloader-tar-index 1
    "name"<TAB>offset<TAB>size[<TAB>"text"]

names and texts as JSON strings; ``offset`` is that of the member's data from the start of
the shard (bytes). Written to a temporary name, then renamed: a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from aioloader.read.tars import BLOCK, Member, TarFormatError, parse_header, parse_pax

__all__ = [
    "SCANS",
    "SMALL",
    "cached",
    "index_dir",
    "keep",
    "local_index",
    "read_index",
    "scan",
    "scan_local",
    "write_index",
]

#: Members up to this size (bytes) are read while scanning: labels (``.cls``, a short ``.json``).
SMALL = 1024
#: Shards scanned (or their indexes read) at once.
SCANS = 16
_MAGIC = "aioloader-tar-index 1"


class Stream(Protocol):
    def read(self, n: int) -> bytes: ...


def scan(stream: Stream, shard: str, skip: Callable[[int], int] | None = None) -> list[Member]:
    """The members of the tar read from ``stream`` (front to back), ``shard`` naming it in
    errors. ``skip(n)`` moves past ``n`` bytes and says how many there were (a seek); without
    it they are read and dropped. A :class:`~aioloader.read.tars.TarFormatError` names the
    shard and the member for a header that is not one, a member cut short, a shard cut
    inside a header."""
    members: list[Member] = []
    pos, long_name = 0, None
    pax: dict[str, str] = {}
    while True:
        block = stream.read(BLOCK)
        if not block:  # the end without its two zero blocks: as tarfile, accepted
            return members
        header = parse_header(block, shard, pos)
        if header is None:
            return members
        pos += BLOCK
        size = int(pax.get("size", header.size)) if header.kind not in "xgL" else header.size
        padded = -(-size // BLOCK) * BLOCK
        name = pax.get("path") or long_name or header.name
        small = header.kind in "xgL" or (header.kind in ("0", "7") and size <= SMALL)
        if small:
            data = _read_exactly(stream, padded)
            got = len(data)
        else:
            got = skip(padded) if skip is not None else _drop(stream, padded)
        if min(got, padded) < size:
            raise TarFormatError(f"{shard}: member {name!r} cut short: {max(got, 0)} of its {size} bytes")
        if header.kind == "L":
            long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif header.kind == "x":
            pax = parse_pax(data[:size])
        elif header.kind != "g":
            if header.kind in ("0", "7"):
                text = _text(data[:size]) if small else None
                members.append(Member(name, pos, size, text))
            long_name, pax = None, {}
        pos += padded


def _read_exactly(stream: Stream, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        part = stream.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _drop(stream: Stream, n: int) -> int:
    got = 0
    while got < n:
        part = stream.read(min(n - got, 1 << 20))
        if not part:
            break
        got += len(part)
    return got


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def index_dir() -> Path:
    """Where scanned indexes are kept (see the module docstring)."""
    env = os.environ.get("AIOLOADER_CACHE")
    if env:
        return Path(env).expanduser() / "tars"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "aioloader" / "tars"


def write_index(members: list[Member], path: Path) -> None:
    """``members`` in the index format at ``path``, atomically."""
    lines = [_MAGIC]
    for m in members:
        line = f"{json.dumps(m.name)}\t{m.offset}\t{m.size}"
        lines.append(line if m.text is None else f"{line}\t{json.dumps(m.text)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".idx")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def read_index(text: str, where: str) -> list[Member]:
    """The members of an index file's ``text``; a ``ValueError`` naming ``where`` if it is
    not one."""
    lines = text.splitlines()
    if not lines or lines[0] != _MAGIC:
        raise ValueError(f"{where}: not an aioloader tar index (no {_MAGIC!r} line)")
    members = []
    for n, line in enumerate(lines[1:], 2):
        try:
            fields = line.split("\t")
            small: str | None = json.loads(fields[3]) if len(fields) > 3 else None
            members.append(Member(str(json.loads(fields[0])), int(fields[1]), int(fields[2]), small))
        except (ValueError, IndexError):
            raise ValueError(f"{where}: line {n} is not an index entry: {line[:80]!r}") from None
    return members


def scan_local(path: str) -> list[Member]:
    """A fresh scan of the local shard at ``path`` (no sidecar, no cache)."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        return scan(f, path, lambda n: _seek(f, n, size))


def local_index(path: str) -> list[Member]:
    """The local shard's members: its sidecar, else the cache, else a scan (kept)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"from_tars: shard {path!r} does not exist") from None
    sidecar = Path(path + ".idx")
    if sidecar.is_file():
        return read_index(sidecar.read_text("utf-8"), str(sidecar))
    key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    found = cached(key)
    if found is None:
        found = scan_local(path)
        keep(key, found)
    return found


def _seek(f: Any, n: int, size: int) -> int:
    here: int = f.tell()
    f.seek(min(here + n, size))
    return min(n, size - here)


def _cache_path(key: str) -> Path:
    return index_dir() / (hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest() + ".idx")


def cached(key: str | None) -> list[Member] | None:
    """The index kept for ``key`` (a shard's address and identity), if any."""
    if key is None:
        return None
    try:
        return read_index(_cache_path(key).read_text("utf-8"), key)
    except (OSError, ValueError):
        return None


def keep(key: str | None, members: list[Member]) -> None:
    """Keep ``members`` as the index for ``key`` (not where the cache cannot be written:
    scanned again next time)."""
    if key is not None:
        try:
            write_index(members, _cache_path(key))
        except OSError:
            pass

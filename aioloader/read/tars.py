"""Tar shards in the WebDataset layout, as pure functions: a header's fields, the members of a
shard, its samples, and the names a shard list expands to. No I/O (the scans that feed these
are :mod:`aioloader.read.tarscan`).

Why a parser of our own and not :mod:`tarfile`: ``tarfile`` reads a stream front to back
through a file object and keeps every member's ``TarInfo`` (with its Python attributes, some
hundreds of bytes each); the index needs only each member's name, data offset and size, read
from 512-byte headers that arrive from a ``pread`` past the data of the member before (a
local shard) or from one HTTP response parsed as it streams (a remote one). The formats
read: POSIX ustar (``prefix`` + ``name``), GNU long names (type ``L``) and pax extended
headers (type ``x``: ``path`` and ``size``; global ``g`` headers are skipped). A header whose
checksum is wrong is not a tar header: an error naming the shard and the offset.

A WebDataset sample is the run of consecutive members sharing a key: the member's name up to
the first ``.`` of its last path component (``dir/abc.seg.jpg``: key ``dir/abc``, extension
``seg.jpg``), as webdataset's ``base_plus_ext``.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BLOCK",
    "IMAGE_MEMBERS",
    "Header",
    "Member",
    "TarFormatError",
    "expand_braces",
    "group_samples",
    "parse_header",
    "parse_pax",
    "sample_entries",
    "split_key",
]

#: A tar block: every header and every member's padded data are whole blocks.
BLOCK = 512


class TarFormatError(ValueError):
    """A shard that is not a well-formed tar: its message names the shard and where."""


@dataclass(frozen=True, slots=True)
class Header:
    """One 512-byte header: ``name`` (ustar's prefix joined), ``size`` of the data that
    follows (bytes), ``kind`` (the typeflag: ``"0"`` a file, ``"L"`` a GNU long name, ``"x"``
    a pax header, ...)."""

    name: str
    size: int
    kind: str


@dataclass(frozen=True, slots=True)
class Member:
    """A regular file in a shard: its ``name``, the ``offset`` of its data from the start of
    the shard and its ``size`` (bytes); ``text``, its content when the scan kept it (a small
    member: a ``.cls`` label, a short ``.json``), else None."""

    name: str
    offset: int
    size: int
    text: str | None = None


def _number(field: bytes, shard: str, offset: int) -> int:
    """An octal field (or GNU's base-256, high bit set)."""
    if field and field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarFormatError(
            f"{shard}: not a tar header at byte {offset} (a number field is {text!r})"
        ) from None


def parse_header(block: bytes, shard: str, offset: int) -> Header | None:
    """The header in ``block`` (512 bytes at ``offset`` of ``shard``), or None for an
    all-zero block (the end of the archive). A :class:`TarFormatError` naming the shard and
    the offset for a block whose checksum is wrong, or that was cut short."""
    if len(block) < BLOCK:
        raise TarFormatError(f"{shard}: cut short at byte {offset + len(block)} (inside a tar header)")
    if not any(block):
        return None
    stored = _number(block[148:156], shard, offset)
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:BLOCK])
    if stored != computed:
        raise TarFormatError(f"{shard}: not a tar header at byte {offset} (checksum {stored} != {computed})")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    kind = chr(block[156]) if block[156] else "0"
    return Header(name.decode("utf-8", "surrogateescape"), _number(block[124:136], shard, offset), kind)


def parse_pax(data: bytes) -> dict[str, str]:
    """A pax extended header's records (``"%d %s=%s\\n"``): key to value."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def split_key(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name (see the module docstring)."""
    head, _, last = name.rpartition("/")
    stem, dot, ext = last.partition(".")
    return (f"{head}/{stem}" if head else stem), (ext if dot else "")


def group_samples(members: list[Member]) -> list[tuple[str, dict[str, Member]]]:
    """The samples of a shard: runs of consecutive members sharing a key, in the shard's
    order, each ``(key, {extension: member})``. Names starting with ``__`` or ``.`` in their
    last component (``__index__``, ``.DS_Store``) are not samples' members."""
    samples: list[tuple[str, dict[str, Member]]] = []
    for member in members:
        last = member.name.rpartition("/")[2]
        if last.startswith(("__", ".")):
            continue
        key, ext = split_key(member.name)
        if not samples or samples[-1][0] != key:
            samples.append((key, {}))
        samples[-1][1][ext] = member
    return samples


_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace notation: ``train-{000000..000003}.tar`` (a numbered range, zero
    padding kept) and ``{a,b}`` (a list), any number of them, expanded in order."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    ranged = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if ranged:
        lo, hi = ranged.group(1), ranged.group(2)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        choices = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return list(itertools.chain.from_iterable(expand_braces(head + c + tail) for c in choices))


#: Extensions ``from_tars`` takes as a sample's image, first found (compared lower-case).
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "pgm", "tif", "tiff", "gif")


def sample_entries(
    shard: str,
    members: list[Member],
    image: str | None,
    label: str | tuple[str, str] | None,
    extra: tuple[str, ...] | None = (),
) -> tuple[list[tuple[str, int, int]], list[int], list[str]]:
    """The entries ``(shard, offset, size)`` of ``shard``'s samples, their labels (empty
    without ``label``) and their image members' names. An entry is the image member's data;
    with ``extra`` extensions (None: all of the sample's members) it is the byte range from
    the headers of the first of those members and the image to the end of the last one's
    data, which :class:`~aioloader.read.tarsample.WithMembers` splits again. ``label`` names
    the member holding an int as text (``"cls"``) or ``(extension, field)`` of a JSON member.
    A ``ValueError`` naming the shard and the sample's key for a sample without its image,
    an ``extra`` member or its label, or a label that is not an int."""
    entries: list[tuple[str, int, int]] = []
    labels: list[int] = []
    names: list[str] = []
    starts = _header_starts(members) if extra != () else {}
    for key, parts in group_samples(members):
        lower = {ext.lower(): m for ext, m in parts.items()}
        found = _image(shard, key, lower, image)
        if extra == ():
            entries.append((shard, found.offset, found.size))
        else:
            wanted = list(parts.values()) if extra is None else [found, *_extra(shard, key, lower, extra)]
            start = min(starts[m.offset] for m in wanted)
            entries.append((shard, start, max(m.offset + m.size for m in wanted) - start))
        names.append(found.name)
        if label is not None:
            labels.append(_label(shard, key, lower, label))
    return entries, labels, names


def _header_starts(members: list[Member]) -> dict[int, int]:
    """Where the headers of each member (keyed by its data offset) begin: the end of the
    padded data of the member before it (0 for the first); anything between (a directory,
    a pax header) is headers too."""
    starts, end = {}, 0
    for m in members:
        starts[m.offset] = end
        end = m.offset + -(-m.size // BLOCK) * BLOCK
    return starts


def _image(shard: str, key: str, lower: dict[str, Member], image: str | None) -> Member:
    if image is not None:
        found = lower.get(image.lower())
    else:
        found = next((lower[e] for e in IMAGE_MEMBERS if e in lower), None)
    if found is None:
        wanted = f"{image!r} member" if image is not None else f"image member ({', '.join(IMAGE_MEMBERS)})"
        raise ValueError(f"from_tars: {shard}: sample {key!r} has no {wanted}; it has {sorted(lower)}")
    return found


def _extra(shard: str, key: str, lower: dict[str, Member], extra: tuple[str, ...]) -> list[Member]:
    missing = [e for e in extra if e not in lower]
    if missing:
        raise ValueError(
            f"from_tars: {shard}: sample {key!r} has no {missing[0]!r} member (members={list(extra)!r});"
            f" it has {sorted(lower)}"
        )
    return [lower[e] for e in extra]


def _label(shard: str, key: str, parts: dict[str, Member], label: str | tuple[str, str]) -> int:
    ext, field = (label, None) if isinstance(label, str) else label
    member = parts.get(ext.lower())
    where = f"from_tars: {shard}: sample {key!r}"
    if member is None:
        raise ValueError(
            f"{where} has no {ext!r} member for its label (label={label!r}; label=None for none)"
        )
    if member.text is None:
        raise ValueError(f"{where}: its {ext!r} member is not short UTF-8 text ({member.size} bytes)")
    try:
        value: Any = member.text.strip() if field is None else json.loads(member.text)[field]
        if isinstance(value, (bool, float)):
            raise ValueError
        return int(value)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: label={label!r} is not an int in {member.text[:60]!r}") from None


def expand_shards(shards: object) -> list[str]:
    """The shard names ``from_tars`` was given, in order: each string brace-expanded, each
    local glob (``*``, ``?``, ``[``) matched and sorted; a ``ValueError`` naming what matched
    nothing. The glob is the one I/O here: it lists a local folder."""
    import glob
    import os

    given = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)  # type: ignore[call-overload]
    out: list[str] = []
    for item in given:
        for name in expand_braces(os.fspath(item)):
            if "://" not in name and any(c in name for c in "*?["):
                found = sorted(glob.glob(name))
                if not found:
                    raise ValueError(f"from_tars: {name!r} matches no file")
                out += found
            else:
                out.append(name)
    if not out:
        raise ValueError(f"from_tars: no shards in {shards!r}")
    return out

"""A tar sample's other members for the decode, and the names of the samples' members for
errors (``FileDataset.from_tars``). No I/O.

With ``from_tars(members=...)`` a sample's entry is one byte range of its shard: from the
headers of the first member wanted to the end of the last one's data (its members are
consecutive in the shard), read as one, cached as one. :class:`WithMembers`, the user's
decode wrapped where the loader is made, parses the headers inside those bytes and calls
the decode with webdataset's sample dict::

    {"__key__": "abc", "jpg": b"...", "json": b"..."}

keys the members' extensions, lower-case: the image's and those asked (all of them with
``members="all"``). It runs where the decode does (a worker, a Ray task), so the trainer
never holds a sample's bytes twice.

:class:`MemberNames` keeps each sample's image member name, a shard's names in one string,
so that an error at read time can name the member as well as the shard (about ``len(name)
+ 1`` bytes a sample, one 8-byte start a shard).
"""

from __future__ import annotations

import io
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aioloader.read.tars import IMAGE_MEMBERS, Member, split_key
from aioloader.read.tarscan import scan

__all__ = ["MemberNames", "SampleMembers", "WithMembers", "extra_members"]


def extra_members(members: object) -> tuple[str, ...] | None:
    """``from_tars``'s ``members``: a tuple of lower-case extensions to pass besides the
    image, ``None`` for ``"all"``, ``()`` for none; a ``ValueError`` showing a wrong value."""
    if members is None:
        return ()
    if members == "all":
        return None
    given = [members] if isinstance(members, str) else members
    if not isinstance(given, Sequence) or not all(isinstance(e, str) and e.strip(". ") for e in given):
        raise ValueError(
            f"from_tars: members={members!r} must be None, 'all' or extensions such as ('json', 'txt')"
        )
    return tuple(dict.fromkeys(e.strip(". ").lower() for e in given))


@dataclass(frozen=True, slots=True)
class SampleMembers:
    """What a tar dataset's decode is given: the ``image`` extension asked (None: the first
    of :data:`~aioloader.read.tars.IMAGE_MEMBERS` a sample has) and the ``extra`` ones
    (None: all)."""

    image: str | None
    extra: tuple[str, ...] | None

    def around(self, decode: Callable[[Any], Any] | None) -> WithMembers:
        """``decode`` given each sample's dict (the dict itself for ``decode=None``)."""
        return WithMembers(decode, self.image, self.extra)


@dataclass(frozen=True, slots=True)
class WithMembers:
    """``decode`` called with a sample's members (the module's dict) from the bytes of its
    range. Picklable as the decode it wraps."""

    decode: Callable[[Any], Any] | None
    image: str | None
    extra: tuple[str, ...] | None

    def __call__(self, data: bytes | memoryview) -> Any:
        sample = self.split(data)
        return sample if self.decode is None else self.decode(sample)

    def split(self, data: bytes | memoryview) -> dict[str, Any]:
        """The sample dict of ``data`` (a range of a shard as :class:`SampleMembers` asks)."""
        raw = data if isinstance(data, bytes) else bytes(data)
        found: dict[str, tuple[str, Member]] = {}
        for m in _members(raw):
            key, ext = split_key(m.name)
            found.setdefault(ext.lower(), (key, m))
        image = self.image.lower() if self.image else next((e for e in IMAGE_MEMBERS if e in found), None)
        if image is None or image not in found:
            raise ValueError(f"the sample's bytes hold no image member: only {sorted(found)}")
        key = found[image][0]
        wanted = (
            [e for e, (k, _) in found.items() if k == key] if self.extra is None else [image, *self.extra]
        )
        sample: dict[str, Any] = {"__key__": key}
        for ext in wanted:
            if ext not in found:
                raise ValueError(f"sample {key!r}: its bytes hold no {ext!r} member: only {sorted(found)}")
            m = found[ext][1]
            sample[ext] = raw[m.offset : m.offset + m.size]
        return sample


def _members(raw: bytes) -> list[Member]:
    """The members whose headers are in ``raw``, offsets from its start (its last member's
    data ends it, unpadded: the scan takes that for the archive's end)."""
    stream = io.BytesIO(raw)

    def skip(n: int) -> int:
        here = stream.tell()
        return stream.seek(min(n, len(raw) - here), io.SEEK_CUR) - here

    return scan(stream, "the sample's bytes", skip=skip)


class MemberNames:
    """Each sample's image member name, shard by shard: :meth:`add` a shard's (its samples
    consecutive from ``len(self)``), :meth:`name` of a sample's index."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._joined: list[str] = []
        self._count = 0
        self._last: tuple[int, list[str]] = (-1, [])

    def add(self, names: list[str]) -> None:
        if not names:
            return
        # NUL: the one byte no tar member name holds.
        self._starts.append(self._count)
        self._joined.append("\0".join(names))
        self._count += len(names)

    def __len__(self) -> int:
        return self._count

    @property
    def starts(self) -> list[int]:
        """The index of each shard's first sample (shards without samples left out)."""
        return self._starts

    def name(self, index: int) -> str:
        shard = bisect_right(self._starts, index) - 1
        if self._last[0] != shard:
            self._last = (shard, self._joined[shard].split("\0"))
        return self._last[1][index - self._starts[shard]]

    def __getstate__(self) -> tuple[list[int], list[str], int]:
        return self._starts, self._joined, self._count

    def __setstate__(self, state: tuple[list[int], list[str], int]) -> None:
        self._starts, self._joined, self._count = state
        self._last = (-1, [])

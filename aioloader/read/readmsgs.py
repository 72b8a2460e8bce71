"""What the loader's loop and a reader process say to each other, in order, over the duplex
Connection between them (:mod:`aioloader.read.workers` on the loop's side,
:mod:`aioloader.read.readproc` in the process): one type per message, read by attribute.

loop -> reader process:

- :class:`Group` ``part, paths``: read ``paths`` (local paths or ``file://`` URLs) one after
  another into part ``part`` (``0 <= part < PARTS``) of the process's shared buffer. Framed
  by hand, written only by :func:`frame_group` and read only by :func:`parse_group`: the
  part's number in one byte, then the paths pickled. The paths are pickled
  (:func:`pickle_paths`) before a part is taken, so that a path that cannot be pickled fails
  holding no part; the part's byte is put in front of them once one is.

reader process -> loop, one per group, pickled:

- :class:`GroupRead` ``files, slow, times``: each file attempted, in order, as ``(offset,
  length)`` in bytes within the group's part (its bytes when it did not fit, or its
  ``OSError``); whether the last read was slow (the group stopped there); each read's
  seconds. The loop answers its caller with the same type, each file's bytes copied out.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

__all__ = ["Group", "GroupRead", "frame_group", "parse_group", "pickle_paths"]


@dataclass(frozen=True, slots=True)
class Group:
    """Read ``paths`` into part ``part`` of the reader process's buffer."""

    part: int
    paths: list[str]


@dataclass(frozen=True, slots=True)
class GroupRead:
    """A group's answer: each file attempted, in order, as ``(offset, length)`` in its part
    (or its bytes, or its ``OSError``); ``slow``, whether the last read was slow; ``times``,
    each read's seconds."""

    files: list[Any]
    slow: bool
    times: list[float]

    # Pickled with every group (thousands of files a second): a constructor call, not a
    # __setstate__ (see decode/chunk.py).
    def __reduce__(self) -> tuple[Any, ...]:
        return (GroupRead, (self.files, self.slow, self.times))


def pickle_paths(paths: list[str]) -> bytes:
    """``paths`` as a :class:`Group` carries them, for :func:`frame_group`."""
    return pickle.dumps(paths, protocol=pickle.HIGHEST_PROTOCOL)


def frame_group(part: int, paths: bytes) -> bytes:
    """The message that sends a :class:`Group`: ``part`` in one byte, then ``paths`` (from
    :func:`pickle_paths`)."""
    return bytes((part,)) + paths


def parse_group(data: bytes) -> Group:
    """The :class:`Group` that :func:`frame_group` wrote."""
    return Group(data[0], pickle.loads(memoryview(data)[1:]))

"""A Chrome trace-event file of a loader's work, for Perfetto (ui.perfetto.dev) or
chrome://tracing: one complete event (``"ph": "X"``) per read, decode chunk, collation and
copy, each stage a group of tracks.

A :class:`Tracer` attached to the stage meters (:meth:`~aioloader.observe.stages.StageMeter.leave`
calls :meth:`Tracer.add`) keeps up to ``limit`` events. Events of one stage overlap (64
reads in flight), and a viewer draws overlapping events of one track as if nested, so
:func:`lanes` spreads each stage over tracks ("read 0", "read 1", ...): an event goes to the
lowest track free at its start.
"""

from __future__ import annotations

import heapq
import json
import os
import threading
from typing import Any

__all__ = ["Tracer", "chrome_trace", "lanes"]

#: Track ids: each stage's tracks start at its base.
_BASES = {"read": 1_000_000, "decode": 2_000_000, "collate": 3_000_000, "transfer": 4_000_000}


class Tracer:
    """Events ``(stage, start, seconds, items)``, times in ``time.perf_counter`` seconds."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self.dropped = 0
        self._events: list[tuple[str, float, float, int]] = []
        self._lock = threading.Lock()

    def add(self, stage: str, start: float, seconds: float, items: int) -> None:
        with self._lock:
            if len(self._events) < self.limit:
                self._events.append((stage, start, seconds, items))
            else:
                self.dropped += 1

    def events(self) -> list[tuple[str, float, float, int]]:
        with self._lock:
            return list(self._events)

    def write(self, path: str | os.PathLike[str]) -> int:
        """Write the Chrome trace to ``path``; returns the number of events."""
        events = self.events()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(events), f)
        return len(events)


def lanes(spans: list[tuple[float, float]]) -> list[int]:
    """For intervals ``(start, seconds)``, a track each such that intervals on one track do
    not overlap: the lowest track free at the interval's start (greedy, by start time)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    free: list[int] = []  # tracks free now (a heap)
    busy: list[tuple[float, int]] = []  # (end, track)
    count = 0
    out = [0] * len(spans)
    for i in order:
        start, seconds = spans[i]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            track = heapq.heappop(free)
        else:
            track, count = count, count + 1
        out[i] = track
        heapq.heappush(busy, (start + seconds, track))
    return out


def chrome_trace(events: list[tuple[str, float, float, int]]) -> dict[str, Any]:
    """The trace-event JSON object for ``events`` (times from the first event, in µs)."""
    t0 = min((e[1] for e in events), default=0.0)
    out: list[dict[str, Any]] = [_meta("process_name", 0, name="aioloader")]
    for stage, base in _BASES.items():
        mine = [e for e in events if e[0] == stage]
        tracks = lanes([(e[1], e[2]) for e in mine])
        for track in sorted(set(tracks)):
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": 1,
                    "tid": base + track,
                    "args": {"name": f"{stage} {track}"},
                }
            )
            out.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": 1,
                    "tid": base + track,
                    "args": {"sort_index": base + track},
                }
            )
        for (_, start, seconds, items), track in zip(mine, tracks, strict=True):
            out.append(
                {
                    "name": stage,
                    "ph": "X",
                    "pid": 1,
                    "tid": base + track,
                    "ts": round((start - t0) * 1e6, 1),
                    "dur": round(seconds * 1e6, 1),
                    "args": {"items": items},
                }
            )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def _meta(what: str, tid: int, **args: Any) -> dict[str, Any]:
    """A metadata event: names and orders the tracks."""
    return {"name": what, "ph": "M", "pid": 1, "tid": tid, "args": args}

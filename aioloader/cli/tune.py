"""``aioloader bench --tune``: the user's files through loaders of fixed settings, one after
another, to find the best, next to a loader left on ``"auto"`` and what it chose.

The sweep is a coordinate search, not the whole grid (which on 12 cores would be 80 runs):
``io_concurrency`` over :data:`IO_SWEEP` with every usable CPU decoding, then
``num_workers`` over :func:`worker_sweep` at the best ``io_concurrency``. Each setting runs
for ``seconds`` after its first batch, however long that took, and its rate counts the
batches in them: start-up is excluded (it is not what these settings tune; the trainer sees
the rate once the loader is warm). ``rounds`` repeats the whole sweep and keeps each
setting's median, for machines whose speed drifts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from aioloader.cli.measure import measure_loader

__all__ = ["IO_SWEEP", "Setting", "Trial", "format_tune", "tune", "worker_sweep"]

#: A value of ``io_concurrency`` or ``num_workers``.
Setting = int | Literal["auto"]

#: The fixed ``io_concurrency`` values tried.
IO_SWEEP = (8, 16, 32, 64, 128, 256, 512)


@dataclass
class Trial:
    """One setting's throughput (``"auto"`` where the tuner chose; ``chose`` then says what
    it had reached at the end: ``[io_concurrency, num_workers]``)."""

    io_concurrency: Setting
    num_workers: Setting
    samples_per_s: float
    chose: list[int] | None = None


def worker_sweep(usable: int) -> list[int]:
    """``num_workers`` values tried: powers of two below ``usable``, and ``usable - 1``
    and ``usable`` (at most about log2(usable) + 2 runs)."""
    values = {usable, max(1, usable - 1)}
    n = 1
    while n < usable:
        values.add(n)
        n *= 2
    return sorted(values)


def tune(
    make: Callable[[Setting, Setting], Any],
    usable: int,
    seconds: float,
    rounds: int = 1,
    ios: tuple[int, ...] = IO_SWEEP,
) -> dict[str, Any]:
    """Sweep the loaders ``make(io_concurrency, num_workers)`` returns (unopened); a dict
    with ``auto`` (a :class:`Trial`), ``best`` (the fastest fixed one), ``auto_vs_best``
    (their ratio) and every ``trials`` row."""
    rates: dict[tuple[Setting, Setting], list[float]] = {}
    chose: list[list[int]] = []

    def run(io: Setting, workers: Setting) -> None:
        label = f"io_concurrency={io}, num_workers={workers}"
        got = measure_loader(make(io, workers), seconds, label, after_first=True)
        rates.setdefault((io, workers), []).append(got.rate)
        if io == "auto":
            chose.append([got.stats.io_concurrency, got.stats.num_workers])

    def median(key: tuple[Setting, Setting]) -> float:
        return statistics.median(rates[key])

    for _ in range(rounds):
        run("auto", "auto")
        for io in ios:
            run(io, usable)
    best_io = max(ios, key=lambda io: median((io, usable)))
    for _ in range(rounds):
        for workers in worker_sweep(usable):
            if workers != usable:
                run(best_io, workers)
    trials = [Trial(io, w, round(median((io, w)), 1), chose[-1] if io == "auto" else None) for io, w in rates]
    auto = trials[0]
    best = max(trials[1:], key=lambda t: t.samples_per_s)
    return {
        "seconds": seconds,
        "rounds": rounds,
        "auto": asdict(auto),
        "best": asdict(best),
        "auto_vs_best": round(auto.samples_per_s / best.samples_per_s, 3) if best.samples_per_s else None,
        "trials": [asdict(t) for t in trials],
    }


def format_tune(t: dict[str, Any]) -> list[str]:
    """The report's lines for a :func:`tune` result."""
    lines = [
        f"  tuning ({t['seconds']:g} s per setting after its first batch, median of {t['rounds']}):",
        f"    {'io_concurrency':>14} {'num_workers':>12} {'samples/s':>10}",
    ]
    for trial in t["trials"]:
        io, workers = trial["io_concurrency"], trial["num_workers"]
        if trial["chose"] is not None:
            io, workers = f"auto ({trial['chose'][0]})", f"auto ({trial['chose'][1]})"
        lines.append(f"    {io!s:>14} {workers!s:>12} {trial['samples_per_s']:>10.0f}")
    best, auto = t["best"], t["auto"]
    lines += [
        f"  best fixed: io_concurrency={best['io_concurrency']}, num_workers={best['num_workers']}: "
        f"{best['samples_per_s']:.0f} samples/s",
        f"  auto chose io_concurrency={auto['chose'][0]}, num_workers={auto['chose'][1]}: "
        f"{auto['samples_per_s']:.0f} samples/s, {t['auto_vs_best']}x the best fixed setting",
    ]
    return lines

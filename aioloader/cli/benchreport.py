"""What ``aioloader bench`` measured (:class:`BenchResult`, also its ``--json``) and the
verdict it prints (:func:`format_report`): pure, no loader runs here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BenchResult", "format_report", "stage_dict"]


@dataclass
class BenchResult:
    """What ``aioloader bench`` measured (rates over the run after the first batch)."""

    source: str
    files: int
    seconds: float
    samples: int
    samples_per_s: float
    mb_per_s: float
    first_batch_s: float | None
    min_step_ms: float
    bottleneck: dict[str, str]
    stages: dict[str, dict[str, Any]]
    settings: dict[str, Any]
    compare: dict[str, Any] | None = None
    trace: str | None = None
    tune: dict[str, Any] | None = None
    cluster: dict[str, Any] | None = None
    #: Samples left out under ``--on-error skip``, by error class.
    failures: dict[str, int] | None = None


def stage_dict(stage: Any) -> dict[str, Any]:
    """A stage's figures (:class:`~aioloader.observe.stages.StageStats`) as the report keeps them."""
    return {
        "items": stage.items,
        "busy_share": round(stage.busy_share, 4),
        "mean_in_flight": round(stage.mean_in_flight, 2),
        "bound": stage.bound,
        "p50_ms": None if stage.p50_ms is None else round(stage.p50_ms, 3),
        "p99_ms": None if stage.p99_ms is None else round(stage.p99_ms, 3),
    }


def format_report(r: BenchResult) -> str:
    """The human-readable verdict."""
    s = r.settings
    lines = [
        f"aioloader bench {r.source}: {r.files} files, {r.seconds:.1f} s after the first batch "
        f"({r.first_batch_s} s), batch {s['batch_size']}, {s['num_workers']} "
        f"{'Ray tasks at once' if s.get('decode_on') == 'ray' else 'workers'}, "
        f"io_concurrency {s['io_concurrency']}, decode {s['decode']}",
        f"  {r.samples_per_s:.0f} samples/s, {r.mb_per_s:.1f} MB/s",
        "",
        f"  {'stage':<9} {'items':>8} {'busy':>5} {'in flight / bound':>18} {'p50 ms':>8} {'p99 ms':>8}",
    ]
    for name, st in r.stages.items():
        p50 = "-" if st["p50_ms"] is None else f"{st['p50_ms']:.1f}"
        p99 = "-" if st["p99_ms"] is None else f"{st['p99_ms']:.1f}"
        flight = f"{st['mean_in_flight']:.1f} / {st['bound']}"
        lines.append(f"  {name:<9} {st['items']:>8} {st['busy_share']:>5.0%} {flight:>18} {p50:>8} {p99:>8}")
    lines += [
        "",
        f"  bottleneck: {r.bottleneck['stage']}: {r.bottleneck['advice']}",
        f"  this rate feeds a train step of {r.min_step_ms:.1f} ms per batch or longer without waiting",
    ]
    if r.failures:
        lines.append(
            f"  skipped (--on-error skip): {sum(r.failures.values())} samples over the run "
            f"(a bad file again each epoch), {r.failures}"
        )
    if r.cluster is not None:
        c = r.cluster
        lines.append(f"  decode on ray: {c['how']}")
        if "tasks" in c:
            lines.append(
                f"    {c['tasks']} tasks, {c['samples']} samples, {c['slots']} at once, "
                f"busy {c['busy_share']:.0%}; per sample {c['decode_ms_per_sample']:.2f} ms decode, "
                f"{c['read_ms_per_sample']:.2f} ms reading URLs, "
                f"{c['transfer_ms_per_sample']:.2f} ms waiting and in transfer"
            )
    if r.compare is not None:
        lines.append(
            f"  {r.compare['loader']}: {r.compare['samples_per_s']:.0f} samples/s; "
            f"aioloader {r.compare['aioloader_ratio']}x"
        )
    if r.tune is not None:
        from aioloader.cli.tune import format_tune

        lines += ["", *format_tune(r.tune)]
    if r.trace:
        lines.append(f"  trace written to {r.trace}: open it in https://ui.perfetto.dev or chrome://tracing")
    return "\n".join(lines)

"""Kill the trainer, count what is left: every kill case of tests/crashkit.py, ``--rounds``
times each, for aioloader and for DataLoader(num_workers=2, persistent_workers=True).

A case is one loader kind, one signal (SIGKILL, SIGTERM) sent to the trainer's process
alone, and one moment (phase: start, mid-epoch, hung-decode, close, held-batch; see
crashkit.py). A run *leaks* when, ``--limit`` seconds after the kill, a process of the
trainer's session, a ``/dev/shm/aioloader-<pid>-*`` segment, a memfd slab of the trainer's
(or its loader process's) that any process still holds or maps, or a new POSIX semaphore is
still there. The time is from the kill to the moment the last of them is gone (runs that
leak are left out of it). Zombies count as gone: they have exited. The last column counts
runs whose stderr shows a traceback (a helper complaining as it dies).

    python benchmarks/crash.py [--rounds 20] [--kinds aioloader,dataloader] [--phases ...]
                               [--signals SIGKILL,SIGTERM] [--limit 5] [--out FILE]

Rounds are interleaved (every case once, then again), so a slow moment of the machine
spreads over all cases. Writes the table to stdout and, with ``--out``, to that file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import signal
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from crashkit import KINDS, PHASES, Outcome, run_case
from helpers import write_numbered_files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--kinds", default="aioloader,dataloader", help=f"of {', '.join(KINDS)}")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--signals", default="SIGKILL,SIGTERM")
    p.add_argument("--limit", type=float, default=5.0, help="seconds after the kill (%(default)s)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    kinds = args.kinds.split(",")
    phases = args.phases.split(",")
    sigs = [signal.Signals[name] for name in args.signals.split(",")]
    results: dict[tuple[str, str, str], list[Outcome]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_numbered_files(folder, 64)
        for r in range(args.rounds):
            for kind in kinds:
                for sig in sigs:
                    for phase in phases:
                        outcome = run_case(kind, phase, sig, paths, folder, args.limit)
                        results[(kind, sig.name, phase)].append(outcome)
                        what = "LEAK" if outcome.leaked else f"{outcome.seconds * 1000:.0f} ms"
                        print(
                            f"round {r + 1}: {kind} {sig.name} {phase}: {what}", file=sys.stderr, flush=True
                        )
    lines = [
        "# benchmarks/crash.py: what a killed trainer leaves behind",
        f"# command: python {' '.join(shlex.quote(a) for a in sys.argv)}",
        f"# date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; {os.cpu_count()} CPUs; "
        f"Python {sys.version.split()[0]}",
        "",
        "| loader | signal | killed during | runs | leaked runs (processes / segments / semaphores) "
        "| kill to clean, median ms | max ms | runs with a traceback |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for (kind, sig_name, phase), outcomes in results.items():
        procs = sum(bool(o.survivors) for o in outcomes)
        segs = sum(bool(o.segments) for o in outcomes)
        sems = sum(bool(o.semaphores) for o in outcomes)
        leaked = sum(o.leaked for o in outcomes)
        clean = [o.seconds * 1000 for o in outcomes if not o.leaked]
        med = f"{statistics.median(clean):.0f}" if clean else "-"
        worst = f"{max(clean):.0f}" if clean else "-"
        lines.append(
            f"| {kind} | {sig_name} | {phase} | {len(outcomes)} | {leaked} ({procs} / {segs} / {sems}) "
            f"| {med} | {worst} | {sum('Traceback' in o.stderr for o in outcomes)} |"
        )
    total = {
        kind: sum(o.leaked for (k, _, _), os_ in results.items() if k == kind for o in os_) for kind in kinds
    }
    lines.append("")
    lines.append("leaked runs in all: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

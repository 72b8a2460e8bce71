"""The ``aioloader`` command line (also ``python -m aioloader``).

``aioloader demo`` trains a small CNN on a generated JPEG dataset twice, once loading each
batch in the training loop and once fed by :class:`aioloader.Loader`, and prints how long
the trainer waited for data each way. ``aioloader bench PATH_OR_URL`` runs the user's own
files through the loader and names the bottleneck (:mod:`aioloader.cli.bench`).
``aioloader doctor`` checks the environment a loader will meet (torch and CUDA, GPUs, CPUs,
``/dev/shm``, limits, memory, ranks), each finding with what to do, then lists, and with
``--remove`` removes, shared memory left by loaders whose process is gone
(:mod:`aioloader.cli.doctor`). ``aioloader index SHARD...`` writes tar shards' indexes
(:mod:`aioloader.cli.index`).

This module stays light (argparse, os) and imports the demo, and with it torch, only when
the command runs: the decode workers' fork server preloads the modules the main script
imported at its top level, so a heavy import here would be paid by every fork server.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from aioloader.cli.args import image_size, loader_process, positive_int

__all__ = ["build_parser", "default_cache_root", "main"]


def default_cache_root() -> Path:
    """Where generated datasets go: ``$AIOLOADER_CACHE``, else ``$XDG_CACHE_HOME/aioloader``,
    else ``~/.cache/aioloader``."""
    env = os.environ.get("AIOLOADER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "aioloader"


def _device(text: str) -> str:
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} must be 'cpu', 'cuda' or 'cuda:N'")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aioloader`` command, with its subcommands."""
    from aioloader import __version__

    parser = argparse.ArgumentParser(
        prog="aioloader",
        description="aioloader: keep the accelerator fed. Run 'aioloader demo' to see it at work.",
    )
    parser.add_argument("--version", action="version", version=f"aioloader {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="train a small CNN on generated JPEGs, loading sequentially vs with aioloader.Loader",
        description=(
            "Generate (once) a synthetic ImageFolder of JPEGs, then train a small CNN on it for a "
            "short run twice: (a) the sequential way, reading, decoding and collating each batch "
            "in the training loop before its train step; (b) fed by aioloader.Loader, which "
            "reads, decodes and collates the next batches in the background. Prints time per "
            "epoch, samples/s, the share of time the trainer waited for data, and the speedup."
        ),
    )
    demo.add_argument(
        "--data-dir",
        type=Path,
        default=default_cache_root() / "demo",
        metavar="DIR",
        help="cache folder for the generated dataset, reused across runs "
        "(default: $AIOLOADER_CACHE/demo, else ~/.cache/aioloader/demo; here %(default)s)",
    )
    demo.add_argument(
        "--images", type=positive_int, default=1500, help="number of JPEG files (default: %(default)s)"
    )
    demo.add_argument(
        "--classes",
        type=positive_int,
        default=10,
        help="number of classes, one sub-folder each (default: %(default)s)",
    )
    demo.add_argument(
        "--image-size",
        type=image_size,
        default=(500, 375),
        metavar="WxH",
        help="size of the generated JPEGs (default: 500x375, about 100 KB each)",
    )
    demo.add_argument(
        "--crop",
        type=positive_int,
        default=224,
        help="side of the decoded, centre-cropped images (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size", type=positive_int, default=64, help="samples per batch (default: %(default)s)"
    )
    demo.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="aioloader decode processes (default: the CPUs this process may use)",
    )
    demo.add_argument(
        "--loader-process",
        type=loader_process,
        default="auto",
        metavar="{auto,true,false}",
        help="where aioloader's pipeline runs: a loader process where one can be made (auto, the "
        "default), insist on one (true), or the training process (false)",
    )
    demo.add_argument(
        "--epochs",
        type=positive_int,
        default=3,
        help="epochs per way (default: %(default)s); with 2 or more, the first is a warm-up "
        "left out of the per-epoch figures",
    )
    demo.add_argument(
        "--steps",
        "--limit",
        type=positive_int,
        default=None,
        help="stop each epoch after this many batches (default: the whole dataset)",
    )
    demo.add_argument(
        "--device",
        type=_device,
        default=None,
        help="'cpu', 'cuda' or 'cuda:N' to train on (default: cuda when available, else cpu)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for the data, shuffling and the model (default: %(default)s)",
    )
    demo.set_defaults(error=demo.error)
    doctor = sub.add_parser(
        "doctor",
        help="check the environment a loader will meet, and list (with --remove, remove) shared "
        "memory left by loaders whose process is gone",
        description=(
            "Check the environment a loader will meet: torch and CUDA, GPUs and their driver, "
            "nvImageCodec, usable CPUs and the cgroup quota, /dev/shm, the open-file limit, the "
            "multiprocessing start method, memory and the cgroup memory limit, ranks on the node; "
            "each finding says what to do. Then list the shared-memory segments and semaphores of "
            "aioloader loaders whose process no longer runs (left by an aioloader older than its "
            "crash guarantees, or by a whole process group killed at once). Names of running "
            "loaders are never touched. Pids are judged in this pid namespace: where containers "
            "share /dev/shm, run it in the container whose trainers made them."
        ),
    )
    doctor.add_argument("--remove", action="store_true", help="remove the leftovers listed")
    from aioloader.cli.bench import add_parser as add_bench  # argparse only: torch is imported when it runs

    add_bench(sub)
    from aioloader.cli.index import add_parser as add_index

    add_index(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aioloader`` command; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "doctor":
        from aioloader.cli.doctor import run_doctor  # torch: imported only when it runs

        return run_doctor(args.remove)
    if args.command == "index":
        from aioloader.cli.index import main as index

        return index(args)
    if args.command == "bench":
        from aioloader.cli.bench import main as bench

        return bench(args)
    if args.classes > args.images:
        args.error(f"--classes {args.classes} is more than --images {args.images}")
    from aioloader.cli.demo import DemoOptions, run_demo  # torch: imported only when the demo runs

    options = DemoOptions(
        data_dir=args.data_dir,
        images=args.images,
        classes=args.classes,
        image_size=args.image_size,
        crop=args.crop,
        batch_size=args.batch_size,
        workers=args.workers,
        loader_process=args.loader_process,
        epochs=args.epochs,
        steps=args.steps,
        device=args.device,
        seed=args.seed,
    )
    try:
        return run_demo(options)
    except KeyboardInterrupt:
        print("interrupted")
        return 130

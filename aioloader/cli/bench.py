"""``aioloader bench PATH_OR_URL``: the user's own files through the loader for a bounded time,
with nothing training (so the loader's own limit shows), then a verdict: samples/s and MB/s,
the stage table, the bottleneck with its advice, and the shortest train step this rate can
feed without the trainer waiting. ``--compare torch`` runs ``torch.utils.data.DataLoader``
on the same files and decode for the same time; ``--trace FILE`` writes a Chrome trace
(:mod:`aioloader.observe.trace`); ``--json`` prints one JSON object on stdout (progress stays on
stderr). ``--decode-on ray`` decodes as Ray tasks (``Loader(decode_on="ray")``): on the cluster
``ray.init(address="auto")`` finds, else on a one-node cluster of the usable CPUs that bench
starts (and shuts down at the end); the cluster's figures are printed beside the verdict.
``--cache memory|DIR`` runs two whole epochs with a sample cache instead, epoch 1 (filling it)
beside epoch 2 (served from it): :mod:`aioloader.cli.cachebench`.

The folder is read as an ImageFolder (``root/<class>/...``), else as a flat folder of
files; a URL prefix (``s3://bucket/train/``) as an ImageFolder in object storage.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aioloader.cli.args import int_or_auto, loader_process
from aioloader.cli.benchreport import BenchResult, format_report, stage_dict
from aioloader.cli.measure import compare_torch, measure_loader

if TYPE_CHECKING:
    from aioloader.loader import Loader

__all__ = ["BenchResult", "add_parser", "format_report", "load_decode", "run_bench"]


def add_parser(sub: Any) -> None:
    """The ``bench`` subcommand's arguments (torch is not imported here)."""
    p = sub.add_parser(
        "bench",
        help="measure your own data through the loader and name the bottleneck",
        description="Load your own files for a bounded time with nothing training, so the loader's own "
        "limit shows, then print samples/s and MB/s, the stage table, the bottleneck with its advice, and "
        "the shortest train step this rate can feed without the trainer waiting.",
    )
    p.add_argument("source", metavar="PATH_OR_URL", help="a folder (ImageFolder or flat) or a URL prefix")
    p.add_argument(
        "--decode",
        default="image:224",
        help="'image:SIZE' (the built-in ImageDecoder) or 'module:function' (default: %(default)s)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument(
        "--workers",
        type=int_or_auto,
        default=None,
        help="decode processes, or 'auto' (default: the usable CPUs)",
    )
    p.add_argument(
        "--io-concurrency", type=int_or_auto, default="auto", help="reads in flight (default: %(default)s)"
    )
    p.add_argument(
        "--loader-process",
        type=loader_process,
        default="auto",
        metavar="{auto,true,false}",
        help="where the pipeline runs: a loader process where one can be made (auto, the default; "
        "with --trace, this process, where the trace is recorded), insist on one (true), or this "
        "process (false)",
    )
    p.add_argument(
        "--decode-on",
        choices=["local", "ray"],
        default="local",
        help="where the decode runs: local worker processes, or Ray tasks on the cluster "
        "ray.init(address='auto') finds, else on a local one bench starts (default: %(default)s)",
    )
    p.add_argument(
        "--on-error",
        choices=["raise", "skip"],
        default="raise",
        help="a file that cannot be read or decoded: stop (raise), or leave it out, with one WARNING "
        "line per file, and count it (skip) (default: %(default)s)",
    )
    p.add_argument("--seconds", type=float, default=15.0, help="how long to load (default: %(default)s)")
    p.add_argument(
        "--tune",
        action="store_true",
        help="then sweep io_concurrency and num_workers and print the best next to what 'auto' chose",
    )
    p.add_argument(
        "--tune-seconds", type=float, default=4.0, help="per setting of --tune (default: %(default)s)"
    )
    p.add_argument(
        "--tune-rounds",
        type=int,
        default=1,
        help="sweeps with --tune, each setting's median kept (default: %(default)s)",
    )
    p.add_argument("--compare", choices=["torch"], default=None, help="also run DataLoader for as long")
    p.add_argument("--trace", metavar="FILE", default=None, help="write a Chrome trace (Perfetto) to FILE")
    p.add_argument("--storage-options", metavar="JSON", default=None, help="options for a URL, as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    from aioloader.cli.cachebench import add_cache_args

    add_cache_args(p)


def load_decode(spec: str) -> Any:
    """``image:224`` -> ``ImageDecoder(224)``; ``module:function`` -> that function (the
    current directory is importable, as for ``python -m``)."""
    kind, _, arg = spec.partition(":")
    if kind == "image":
        from aioloader.decode.image import ImageDecoder

        try:
            return ImageDecoder(int(arg or 224))
        except ValueError:
            raise ValueError(f"--decode {spec!r}: the size after 'image:' must be an integer") from None
    if not arg:
        raise ValueError(f"--decode {spec!r} must be 'image:SIZE' or 'module:function'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(kind), arg)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--decode {spec!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"--decode {spec!r} is not callable")
    return fn


def _dataset(source: str, options: dict[str, Any] | None) -> Any:
    from aioloader.dataset import FileDataset, _walk
    from aioloader.read.urls import is_remote

    if is_remote(source):
        return FileDataset.from_folder(source, storage_options=options, extensions=None)
    root = Path(source)
    if not root.is_dir():
        raise ValueError(f"{source!r} is not a folder or a URL prefix")
    try:
        return FileDataset.from_folder(root, extensions=None)
    except ValueError:  # no class sub-folders: a flat folder of files
        files = _walk(root)
        if not files:
            raise ValueError(f"{source!r} holds no files") from None
        return FileDataset(files)


def run_bench(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark ``args`` describe (see :func:`add_parser`); with ``--decode-on ray``,
    on the cluster :func:`ray_cluster` connects to (shut down after, if bench started it)."""
    if getattr(args, "decode_on", "local") != "ray":
        return _run(args, None)
    if args.tune:
        raise ValueError("--tune sweeps the local decode workers: it cannot go with --decode-on ray")
    ray, cluster = ray_cluster()
    print(f"aioloader bench: {cluster['how']}", file=sys.stderr, flush=True)
    try:
        return _run(args, cluster)
    finally:
        if cluster["started_by_bench"]:
            ray.shutdown()


def ray_cluster() -> tuple[Any, dict[str, Any]]:
    """``ray``, connected: to the cluster ``ray.init(address="auto")`` finds, else to a local
    one of the usable CPUs started here; and a dict saying which (``how``, ``address``,
    ``cpus``, ``started_by_bench``)."""
    from aioloader.cluster.connect import ray_module
    from aioloader.config import usable_cpus

    ray = ray_module()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:  # no cluster running: start one on this machine
            ray.init(num_cpus=usable_cpus(), include_dashboard=False, log_to_driver=False)
            started = True
    cpus = int(ray.cluster_resources().get("CPU", 0))
    try:
        address = str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - only for the report
        address = "?"
    how = (
        f"started a local Ray cluster of {cpus} CPUs (shut down at the end)"
        if started
        else f"connected to the Ray cluster at {address} ({cpus} CPUs)"
    )
    return ray, {"how": how, "address": address, "cpus": cpus, "started_by_bench": started}


def _cluster_dict(cluster: Any, ray: dict[str, Any]) -> dict[str, Any]:
    """``stats.cluster`` (a :class:`~aioloader.observe.stats.ClusterStats`) for the report."""
    per = 1e3 / cluster.samples if cluster is not None and cluster.samples else 0.0
    out: dict[str, Any] = dict(ray)
    if cluster is None:
        return out
    out.update(
        tasks=cluster.tasks,
        samples=cluster.samples,
        slots=cluster.slots,
        busy_share=round(cluster.busy_share, 4),
        round_trip_seconds=round(cluster.round_trip_seconds, 3),
        decode_seconds=round(cluster.decode_seconds, 3),
        read_seconds=round(cluster.read_seconds, 3),
        transfer_seconds=round(cluster.transfer_seconds, 3),
        elapsed_seconds=round(cluster.elapsed_seconds, 3),
        decode_ms_per_sample=round(cluster.decode_seconds * per, 3),
        read_ms_per_sample=round(cluster.read_seconds * per, 3),
        transfer_ms_per_sample=round(cluster.transfer_seconds * per, 3),
    )
    return out


def _run(args: argparse.Namespace, cluster: dict[str, Any] | None) -> BenchResult:
    from aioloader.loader import Loader
    from aioloader.observe.bottleneck import diagnose
    from aioloader.observe.trace import Tracer
    from aioloader.read.urls import is_remote

    options = json.loads(args.storage_options) if args.storage_options else None
    decode = load_decode(args.decode)
    dataset = _dataset(args.source, options)
    where = args.loader_process
    if args.trace:
        # The stage meters record the trace in this process: a loader process's are its own.
        if where is True:
            raise ValueError("--trace records the stages in this process: --loader-process auto or false")
        where = False
    loader = Loader(
        dataset,
        batch_size=args.batch_size,
        decode=decode,
        num_workers=args.workers,
        io_concurrency=args.io_concurrency,
        storage_options=options,
        loader_process=where,
        decode_on="local" if cluster is None else "ray",
        on_error=args.on_error,
    )
    config = loader.config
    tracer = Tracer() if args.trace else None
    run = measure_loader(loader, args.seconds, "aioloader", tracer)
    samples, seconds, first, stats = run.samples, run.seconds, run.first_batch_s, run.stats
    rate = run.rate
    verdict = stats.bottleneck
    if verdict is None:  # fewer than two batches in the last epoch: judge the whole run
        verdict = diagnose(
            stats.stages,
            1.0,
            num_workers=stats.num_workers,
            io_concurrency=stats.io_concurrency,
            setup=config.setup(is_remote(dataset.path(0))),
        )
    result = BenchResult(
        source=args.source,
        files=len(dataset),
        seconds=round(seconds, 3),
        samples=samples,
        samples_per_s=round(rate, 1),
        mb_per_s=round(run.bytes_read / seconds / 1e6, 2) if seconds > 0 else 0.0,
        first_batch_s=None if first is None else round(first, 3),
        min_step_ms=round(args.batch_size / rate * 1e3, 2) if rate > 0 else float("inf"),
        bottleneck={"stage": verdict.stage, "advice": verdict.advice},
        stages={name: stage_dict(s) for name, s in stats.stages.items()},
        settings={
            "decode": args.decode,
            "batch_size": args.batch_size,
            # What ran at the end (where "auto" took them), and what was asked for.
            "num_workers": stats.num_workers,
            "io_concurrency": stats.io_concurrency,
            "num_workers_asked": "default" if args.workers is None else args.workers,
            "io_concurrency_asked": args.io_concurrency,
            # Where the pipeline ran ("process" or "thread"), and the setting as given.
            "runtime": loader.runtime,
            "loader_process": args.loader_process,
            "decode_on": "local" if cluster is None else "ray",
            "on_error": args.on_error,
            "seconds": args.seconds,
        },
        cluster=None if cluster is None else _cluster_dict(stats.cluster, cluster),
        failures=dict(stats.failures_by_reason),
    )
    if tracer is not None:
        tracer.write(args.trace)
        result.trace = args.trace
    if args.compare == "torch":
        result.compare = compare_torch(dataset, decode, args, config.build.workers, rate, options)
    if args.tune:
        from aioloader.cli.tune import Setting, tune
        from aioloader.config import usable_cpus

        def make(io: Setting, workers: Setting) -> Loader:
            return Loader(
                dataset,
                batch_size=args.batch_size,
                decode=decode,
                num_workers=workers,
                io_concurrency=io,
                storage_options=options,
                loader_process=where,
                on_error=args.on_error,
            )

        result.tune = tune(make, usable_cpus(), args.tune_seconds, rounds=args.tune_rounds)
    return result


def main(args: argparse.Namespace) -> int:
    from aioloader.errors import LoaderError, SampleError

    try:
        if any(getattr(args, k, None) is not None for k in ("cache", "max_side", "cache_max_bytes")):
            from aioloader.cli.cachebench import cache_report, make_cache

            cache = make_cache(args)  # its options checked before the source is read
            options = json.loads(args.storage_options) if args.storage_options else None
            text = cache_report(args, cache, _dataset(args.source, options), load_decode(args.decode))
        else:
            result = run_bench(args)
            text = json.dumps(asdict(result)) if args.json else format_report(result)
    except (ValueError, FileNotFoundError, ImportError) as exc:  # ImportError: --decode-on ray without Ray
        print(f"aioloader bench: {exc}", file=sys.stderr)
        return 2
    except LoaderError as exc:  # a file that cannot be read or decoded, named with its cause
        if isinstance(exc, SampleError):  # the way past it, in this command's words
            exc.hint = "To leave files that fail out (one WARNING line each, counted), pass --on-error skip."
        print(f"aioloader bench: loading failed: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0

"""Where the GPU decode's time goes, stage by stage, on the same batches: nvImageCodec's batched
decode alone, against each part of ``ImageDecoder(device="cuda")``'s batch path (issue 40):
the plan made on the loader's side, the decode thread's decode into a padded buffer, the
bridge's batched resize and its whole per-batch finish. GPU only: skips cleanly (exit 0, one
line) without CUDA or nvImageCodec; asserts nothing about time.

The path measured (see ``aioloader/decode/ondevice/bridgeside.py``): in the loader process
the collate, ``EncodedBatch.of``, makes Pillow's fixed-point taps for the whole batch
(``aioloader.decode.taps.plan_batch``); on the trainer's side a decode thread, a batch
ahead, has nvImageCodec decode the batch into one padded ``(G, Hmax, Wmax, 3)`` ``uint8``
tensor PyTorch allocated (``NvImageCodecDecoder.decode``), and the bridging thread
(``DeviceDecode.finish``) copies the taps and resizes every image at once
(``aioloader.decode.resize.resize_batch``: a few operations, two batched products).

Data: ``--images`` JPEGs of 500x375 made in memory as ``gpu_train.py`` makes its folder
(``aioloader.synthetic.make_image``, Pillow, quality 90, 4:2:0), their windows and flips drawn
as the loader's device stage draws them (``ImageDecoder.window`` from ``(seed, epoch 0,
index)``), cut into batches of ``--batch`` made into ``EncodedBatch`` es as the collate makes
them. Each stage runs once to warm up, then ``--repeats`` times over those batches in turn;
medians per batch:

- ``call ms``: the call's wall time (it returns once its host side is done: for ``d``, the
  launches); ``done ms``: up to the device's completion (the GPU side too); ``proc CPU ms``:
  the whole process's CPU during the call (nvImageCodec's own threads included); ``thread CPU
  ms``: the calling thread's alone; the same per sample; ``ops``: the ATen operations one call
  dispatches (a ``TorchDispatchMode`` count; "-" where no PyTorch work is done); ``None``: the
  images given back as None or as failed positions; ``before (RESULTS §30)``: the nearest row
  of the table the per-image path produced (RESULTS §30, H200, batches of 128, thread CPU and
  done ms per batch), where there is one.

Stages:

- ``a nvimgcodec whole``: ``Decoder.decode`` of the batch's code streams into nvImageCodec's
  own buffers, aioloader's options (``:fancy_upsampling=1``, one CPU thread); ``a2 ... gpu
  backends``: the same with only the GPU backends allowed;
- ``b aioloader decode into buffer``: ``NvImageCodecDecoder.decode`` into a padded buffer
  PyTorch allocated beforehand (``as_image`` per slot + ``decode(..., images=)``); ``b2 decode
  thread begin``: ``DeviceDecode``'s decode-thread step whole (the buffer allocated on its
  stream, the decode, the event);
- ``c plan (loader side)``: ``EncodedBatch.of`` over the batch's ``EncodedImage`` s (the
  collate, in the loader process: the bytes end to end and the plan); ``c2 plan_batch``: the
  taps alone. Host work only (it runs on the CPU anywhere);
- ``d resize``: ``resize_batch`` on a decoded buffer, the taps already on the device: ``call``
  is the launch, ``done`` the completion; then the CUDA kernels and copies of one call
  (``torch.profiler``: count and device time) and the ATen operations by name;
- ``e bridge finish``: what the bridging thread does per batch: ``DeviceDecode.finish`` over a
  batch the decode thread began (the taps' copies, the resize, the rows placed), the labels'
  copy and event (``DeviceCopier.to_device``) and ``settle(keep=1)``, as the bridge does
  (the taps' host arrays are ordinary memory here, so their copies go through the copier's
  pinned staging: a little more host work than from the loader's page-locked slabs).
  Its thread CPU is issue 40's target (<= 25 ms a batch of 256), printed per 256 below the
  table.

Then cProfile's top 25 by cumulative time of ``b`` and ``e``, a few batches each, and the
nvJPEG libraries the process loaded (``/proc/self/maps``): torchvision's wheels carry their
own ``libnvjpeg``, and a training script imports torchvision before nvImageCodec loads its JPEG
extension. ``--torchvision auto`` (the default) imports torchvision first where it is
installed, as ``gpu_train.py`` does; ``no`` leaves it out.

    python benchmarks/gpu_decode_profile.py [--images 512] [--batch 128] [--repeats 5] [--seed 0]
                                            [--profile-batches 3] [--torchvision auto|no]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SIZE = (500, 375)  # gpu_train.py's images
OUT = 224  # ImageDecoder(224, crop="random", hflip=True)
OPTIONS = ":fancy_upsampling=1"  # aioloader's (NvImageCodecDecoder.start)
PREFIX = "gpu_decode_profile"
TARGET = (25.0, 256)  # issue 40: the bridge thread's CPU, ms per batch of 256

A, A2 = "a nvimgcodec whole", "a2 nvimgcodec whole, gpu backends"
B, B2 = "b aioloader decode into buffer", "b2 decode thread begin (buffer, decode, event)"
C, C2 = "c plan (loader side): EncodedBatch.of", "c2 plan_batch alone"
D = "d resize (resize_batch)"
E = "e bridge finish (finish, to_device, settle)"

#: RESULTS §30 (the per-image path, commit 2e71d42; H200, batches of 128 JPEGs of 500x375):
#: per new stage, the old row nearest to it, with its thread CPU and done ms per batch.
BEFORE: dict[str, tuple[str, float, float]] = {
    A: ("a nvimgcodec whole", 7.4, 7.6),
    A2: ("a2 nvimgcodec whole, gpu backends", 9.6, 9.7),
    C: ("d host prep whole, on the transfer thread", 10.7, 10.8),
    D: ("e finish loop, per image", 66.0, 66.0),
    E: ("c aioloader whole: decode, prep and resize in one call", 101.3, 101.8),
}
BEFORE_BATCH = 128


def make_jpegs(n: int, seed: int = 0, size: tuple[int, int] = SIZE, quality: int = 90) -> list[bytes]:
    """``n`` JPEGs as gpu_train.py's folder holds them (in memory)."""
    from aioloader.synthetic import make_image

    out = []
    for i in range(n):
        buf = io.BytesIO()
        make_image(np.random.default_rng([seed, i]), size[0], size[1]).save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def draw_windows(datas: Sequence[bytes], decoder: Any, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(boxes (n, 4), flips (n,))`` drawn as the loader's device stage draws them."""
    from aioloader.decode.jpeg import jpeg_header
    from aioloader.decode.ondevice.loaderside import sample_generator

    boxes, flips = [], []
    for i, data in enumerate(datas):
        header = jpeg_header(data)
        assert header is not None, f"image {i} is no JPEG"
        box, flip = decoder.window(header.width, header.height, lambda i=i: sample_generator(seed, 0, i))
        boxes.append(box)
        flips.append(flip)
    return np.array(boxes, dtype=np.float64).reshape(-1, 4), np.array(flips, dtype=np.bool_)


def encoded_images(datas: Sequence[bytes], boxes: np.ndarray, flips: np.ndarray, decoder: Any) -> list[Any]:
    """The ``EncodedImage`` s the loader's device stage makes of ``datas`` (one each)."""
    from aioloader.decode.encoded import EncodedImage
    from aioloader.decode.jpeg import jpeg_header

    out = []
    for i, data in enumerate(datas):
        header = jpeg_header(data)
        assert header is not None, f"image {i} is no JPEG"
        box = tuple(float(v) for v in boxes[i])
        size = (header.height, header.width)
        out.append(
            EncodedImage(
                data,
                box,
                bool(flips[i]),
                i,
                f"img_{i:06d}.jpg",
                decoder.height,
                decoder.width,
                size,
                decoder.resample,
            )
        )
    return out


@dataclass
class Stage:
    """One stage's measurements, a row per repeat (milliseconds), ``nones`` per repeat;
    ``ops``: ATen operations of one call (None: not counted)."""

    name: str
    samples: int
    call: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    proc: list[float] = field(default_factory=list)
    thread: list[float] = field(default_factory=list)
    nones: list[int] = field(default_factory=list)
    ops: int | None = None
    error: str | None = None

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self._series().items() if v}

    def _series(self) -> dict[str, list[float]]:
        return {"call": self.call, "done": self.done, "proc": self.proc, "thread": self.thread}


def nones_of(result: Any) -> int:
    """What a stage's call did not decode: the Nones of nvImageCodec's list of images, the
    failed positions aioloader's ``decode`` gives back (a list of ints); else 0."""
    if not isinstance(result, list):
        return 0
    if all(isinstance(r, int) for r in result):
        return len(result)
    return sum(1 for r in result if r is None)


def error_text(e: BaseException) -> str:
    """``Type: first line of the message``, at most 160 characters."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:160]


def time_stage(
    name: str, fn: Callable[[int], Any], batches: int, repeats: int, samples: int, sync: Callable[[], None]
) -> Stage:
    """Run ``fn(batch)`` once to warm up, then ``repeats`` times over the batches in turn."""
    stage = Stage(name, samples)
    try:
        fn(0)
        sync()
        for r in range(repeats):
            p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            result = fn(r % batches)
            w1, p1, t1 = time.perf_counter(), time.process_time(), time.thread_time()
            sync()
            w2 = time.perf_counter()
            stage.call.append((w1 - w0) * 1e3)
            stage.done.append((w2 - w0) * 1e3)
            stage.proc.append((p1 - p0) * 1e3)
            stage.thread.append((t1 - t0) * 1e3)
            stage.nones.append(nones_of(result))
            del result
    except Exception as e:  # noqa: BLE001 - a stage that cannot run says why; the others go on
        stage.error = error_text(e)
        traceback.print_exc(file=sys.stderr)
    return stage


def count_ops(fn: Callable[[], Any]) -> Counter[str]:
    """The ATen operations ``fn()`` dispatches, by name (``aten.bmm.default``: 2)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter[str] = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return seen


def with_ops(stage: Stage, fn: Callable[[], Any]) -> Counter[str]:
    """``stage.ops`` set to the ATen operations of one ``fn()`` (left None where it fails,
    or where the stage failed already); the count by name."""
    if stage.error is not None:
        return Counter()
    try:
        ops = count_ops(fn)
    except Exception:  # noqa: BLE001 - the count is information; its absence says so
        traceback.print_exc(file=sys.stderr)
        return Counter()
    stage.ops = sum(ops.values())
    return ops


def ops_line(ops: Counter[str], top: int = 12) -> str:
    """``n ops: name xN, ...`` largest first (``aten.`` and ``.default`` left out), the first
    ``top`` and the rest as ``other``."""
    if not ops:
        return "n/a"
    items = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    names = [f"{k.removeprefix('aten.').removesuffix('.default')} x{v}" for k, v in items[:top]]
    rest = sum(v for _, v in items[top:])
    if rest:
        names.append(f"other x{rest}")
    return f"{sum(ops.values())} ops: " + ", ".join(names)


def device_work(events: Iterable[Any]) -> tuple[int, float]:
    """``(count, ms)`` of the device's work among ``torch.profiler`` events: those whose
    ``device_type`` is CUDA (kernels, copies, memsets), their time ranges summed."""
    from torch.autograd import DeviceType

    count, us = 0, 0.0
    for e in events:
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            count += 1
            us += float(e.time_range.elapsed_us())
    return count, us / 1e3


def kernel_line(fn: Callable[[], Any], sync: Callable[[], None]) -> str:
    """The CUDA kernels and copies of one ``fn()`` (``torch.profiler``), or why not."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        count, ms = device_work(prof.events())
    except Exception as e:  # noqa: BLE001 - information; its absence says why
        return f"n/a ({error_text(e)})"
    return f"{count} CUDA kernels and copies, {ms:.2f} ms of device time"


def before_cell(name: str, batch: int) -> str:
    """The RESULTS §30 row nearest to stage ``name`` (thread CPU and done ms per batch of
    :data:`BEFORE_BATCH`, scaled to ``batch`` where that differs), or "-"."""
    found = BEFORE.get(name)
    if found is None:
        return "-"
    old, cpu, done = found
    scale = batch / BEFORE_BATCH
    return f"{cpu * scale:.1f} CPU, {done * scale:.1f} done ({old})"


def table(stages: Sequence[Stage], batch: int | None = None) -> str:
    """The stages as a markdown table: medians per batch and per sample; with ``batch``, the
    "before (RESULTS §30)" column."""
    cols = ["stage", "call ms", "done ms", "proc CPU ms", "thread CPU ms", "ms/sample (done)"]
    cols += ["proc CPU ms/sample", "ops", "None"]
    if batch is not None:
        cols.append("before (RESULTS §30)")
    lines = ["| " + " | ".join(cols) + " |", "| --- " + "| ---: " * (len(cols) - 1) + "|"]
    for s in stages:
        m = s.medians()
        if s.error is not None or not m:
            cells = [f"n/a: {s.error or 'no run'}"] + [""] * 7
        else:
            n = max(s.samples, 1)
            cells = [f"{m['call']:.1f}", f"{m['done']:.1f}", f"{m['proc']:.1f}", f"{m['thread']:.1f}"]
            cells += [f"{m['done'] / n:.3f}", f"{m['proc'] / n:.3f}", "-" if s.ops is None else str(s.ops)]
            cells.append(str(max(s.nones, default=0)))
        if batch is not None:
            cells.append(before_cell(s.name, batch))
        lines.append("| " + " | ".join([s.name, *cells]) + " |")
    return "\n".join(lines)


def bridge_line(stage: Stage, target: tuple[float, int] = TARGET) -> str:
    """The bridging thread's CPU per batch (``stage``'s thread CPU), scaled to the target's
    batch, against the target."""
    m = stage.medians()
    if stage.error is not None or "thread" not in m:
        return f"# bridge thread CPU per batch: n/a ({stage.error or 'no run'})"
    per = m["thread"] / max(stage.samples, 1) * target[1]
    verdict = "within" if per <= target[0] else "over"
    return (
        f"# bridge thread CPU per batch: {m['thread']:.1f} ms for {stage.samples} samples, "
        f"{per:.1f} ms per {target[1]} (issue 40's target: <= {target[0]:.0f} ms; {verdict})"
    )


def top_profile(fn: Callable[[], Any], top: int = 25) -> str:
    """cProfile's ``top`` entries of ``fn()`` by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def loaded_libraries(part: str = "nvjpeg", maps: str = "/proc/self/maps") -> list[str]:
    """The files mapped in this process whose name holds ``part``, sorted, each once."""
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if part in Path(p).name)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-batches", type=int, default=3)
    p.add_argument("--torchvision", choices=("auto", "no"), default="auto")
    args = p.parse_args(argv)
    if args.batch < 1 or args.images < args.batch or args.repeats < 1 or args.profile_batches < 0:
        p.error("need 1 <= --batch <= --images, --repeats >= 1 and --profile-batches >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(f"{PREFIX}: skipped: torch not installed")
        return 0
    if not torch.cuda.is_available():
        print(f"{PREFIX}: skipped: no CUDA device")
        return 0
    vision = "not imported"
    if args.torchvision == "auto":
        try:
            import torchvision

            vision = f"torchvision {torchvision.__version__} imported first"
        except ImportError:
            vision = "torchvision not installed"
    try:
        import nvidia.nvimgcodec as nv
    except ImportError as e:
        print(f"{PREFIX}: skipped: nvImageCodec not installed ({e})")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.Stream(device)
    print(
        f"# {PREFIX}: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
        f"nvImageCodec {getattr(nv, '__version__', '?')}, {vision}",
        flush=True,
    )
    # The whole device: the stages use their own streams too (DeviceDecode's, the copier's).
    return run(args, nv, device, stream, lambda: torch.cuda.synchronize(device))


def on_stream(device: Any, stream: Any) -> AbstractContextManager[Any]:
    """``stream`` made current on a CUDA device; nothing elsewhere."""
    import torch

    return torch.cuda.stream(stream) if device.type == "cuda" else nullcontext()


def run(args: argparse.Namespace, nv: Any, device: Any, stream: Any, sync: Callable[[], None]) -> int:
    """The stages (see the module docstring) on ``device``, the decode ordered on ``stream``."""
    import torch

    from aioloader import ImageDecoder
    from aioloader.decode.encoded import EncodedBatch
    from aioloader.decode.nvimgcodec import NvImageCodecDecoder
    from aioloader.decode.ondevice.bridgeside import DeviceDecode
    from aioloader.decode.resize import resize_batch
    from aioloader.decode.taps import plan_batch
    from aioloader.engine.failures import FailurePolicy
    from aioloader.observe.stats import Counters, DeviceDecodeStats
    from aioloader.run.device import DeviceCopier

    t0 = time.perf_counter()
    datas = make_jpegs(args.images, args.seed)
    decoder = ImageDecoder(OUT, crop="random", hflip=True)
    boxes, flips = draw_windows(datas, decoder, args.seed)
    samples = encoded_images(datas, boxes, flips, decoder)
    print(
        f"# data: {len(datas)} JPEGs {SIZE[0]}x{SIZE[1]}, {sum(map(len, datas)) / len(datas) / 1e3:.0f} KB "
        f"mean, made in {time.perf_counter() - t0:.1f} s; batch {args.batch}",
        flush=True,
    )
    nb = len(datas) // args.batch
    columns = [samples[k * args.batch : (k + 1) * args.batch] for k in range(nb)]
    encoded = [EncodedBatch.of(c) for c in columns]
    views = [[e.encoded(i) for i in range(len(e.gpu_rows))] for e in encoded]
    labels = [torch.arange(args.batch, dtype=torch.int64) for _ in range(nb)]

    nvd = NvImageCodecDecoder(device)
    nvd.start()
    index = device.index or 0
    codes = [
        [nvd._parse(v, e.sizes[i]) for i, v in enumerate(vs)] for e, vs in zip(encoded, views, strict=True)
    ]
    with on_stream(device, stream):
        buffers = [
            torch.zeros(
                (len(e.gpu_rows), *(int(v) for v in e.sizes.max(axis=0)), 3), dtype=torch.uint8, device=device
            )
            for e in encoded
        ]
    sync()

    def nv_stage(name: str, **kw: Any) -> Stage:
        try:
            kw = {k: v() if callable(v) else v for k, v in kw.items()}  # backends: made here
            dec = nv.Decoder(device_id=index, **{"max_num_cpu_threads": 1, "options": OPTIONS, **kw})
        except Exception as e:  # noqa: BLE001 - reported in the table
            return Stage(name, args.batch, error=f"Decoder: {error_text(e)}")
        params = nvd._params
        handle = getattr(stream, "cuda_stream", 0)
        return time_stage(
            name,
            lambda k: list(dec.decode(codes[k], params=params, cuda_stream=handle)),
            nb,
            args.repeats,
            args.batch,
            sync,
        )

    stages = [nv_stage(A), nv_stage(A2, backends=_gpu_backends(nv))]

    def decode_into(k: int) -> list[int]:
        with on_stream(device, stream):
            return nvd.decode(views[k], encoded[k].sizes, buffers[k], stream)

    stages.append(time_stage(B, decode_into, nb, args.repeats, args.batch, sync))
    profiled: list[tuple[str, Callable[[int], Any]]] = [(B, decode_into)]
    with_ops(stages[-1], lambda: decode_into(0))

    # The decode thread's and the bridge's steps, as the loader runs them (CPU copier here
    # where there is no CUDA: the same code path, copies being no-ops).
    counters = Counters()
    counters.device = DeviceDecodeStats()
    dd = DeviceDecode(
        decoder,
        device,
        counters,
        FailurePolicy("raise", None, counters),
        make=lambda _, d: NvImageCodecDecoder(d),
    )
    copier = DeviceCopier(device, pin_memory=True)
    copier.start()
    dd.start()

    def begin(k: int) -> list[int]:
        started = dd._begin(encoded[k])
        if started.error is not None:
            raise started.error
        return started.failed

    stages.append(time_stage(B2, begin, nb, args.repeats, args.batch, sync))
    with_ops(stages[-1], lambda: begin(0))

    stages.append(
        time_stage(C, lambda k: EncodedBatch.of(columns[k]), nb, args.repeats, args.batch, lambda: None)
    )

    def plan(k: int) -> Any:
        col = columns[k]
        return plan_batch(
            np.array([s.box for s in col], dtype=np.float64),
            np.array([s.flip for s in col], dtype=np.bool_),
            np.array([s.size for s in col], dtype=np.int64),
            OUT,
            OUT,
            decoder.resample,
        )

    stages.append(time_stage(C2, plan, nb, args.repeats, args.batch, lambda: None))

    # d: the resize alone, the taps already on the device, over buffers decoded beforehand.
    resize_ops: Counter[str] = Counter()
    kernels = "n/a (no CUDA)"
    try:
        for k in range(nb):
            decode_into(k)
        with on_stream(device, stream):
            taps = [
                tuple(torch.from_numpy(a).to(device) for a in (e.xindex, e.xcoef, e.yindex, e.ycoef))
                for e in encoded
            ]
        sync()

        def resize(k: int) -> Any:
            e, (xi, xc, yi, yc) = encoded[k], taps[k]
            dx, nx, dy, ny = e.digits
            with on_stream(device, stream):
                return resize_batch(buffers[k], (xi, xc, dx, nx), (yi, yc, dy, ny), e.across_first)

        stages.append(time_stage(D, resize, nb, args.repeats, args.batch, sync))
        resize_ops = with_ops(stages[-1], lambda: resize(0))
        if device.type == "cuda" and stages[-1].error is None:
            kernels = kernel_line(lambda: resize(0), sync)
    except Exception as e:  # noqa: BLE001 - reported in the table
        traceback.print_exc(file=sys.stderr)
        stages.append(Stage(D, args.batch, error=error_text(e)))

    # e: the bridge's per-batch work over batches the decode thread began beforehand.
    try:
        started = [dd._begin(e) for e in encoded]
        sync()

        def finish(k: int) -> Any:
            out = dd.finish((started[k], labels[k]), copier)
            moved, _ = copier.to_device(out)
            copier.settle(keep=1)
            return moved

        stages.append(time_stage(E, finish, nb, args.repeats, args.batch, sync))
        profiled.append((E, finish))
        with_ops(stages[-1], lambda: finish(0))
    except Exception as e:  # noqa: BLE001 - reported in the table
        traceback.print_exc(file=sys.stderr)
        stages.append(Stage(E, args.batch, error=error_text(e)))

    print(table(stages, args.batch), flush=True)
    print(
        f"\n# before: RESULTS §30, the per-image path on an H200 (batches of {BEFORE_BATCH}, scaled to "
        f"{args.batch}): decode, host prep and the per-image resize all on the transfer thread, in one call",
        flush=True,
    )
    print(bridge_line(stages[-1]), flush=True)
    print(f"# d resize, one call: {ops_line(resize_ops)}; {kernels}", flush=True)
    print(f"# nvJPEG libraries loaded: {', '.join(loaded_libraries()) or 'none found'}", flush=True)
    for name, fn in profiled:

        def batches(fn: Callable[[int], Any] = fn) -> None:
            for k in range(args.profile_batches):
                fn(k % nb)
            sync()

        print(
            f"\n## cProfile, {name}: {args.profile_batches} batches of {args.batch}, top 25 by cumulative time\n"
        )
        print(top_profile(batches), flush=True)
    copier.settle()
    dd.close()
    copier.close()
    nvd.close()
    print(f"# {PREFIX}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def _gpu_backends(nv: Any) -> Callable[[], list[Any]]:
    """The GPU backends (hardware engine, CUDA, hybrid), no CPU decoder: a call, so that a
    library without them fails in its stage, not here."""
    return lambda: [
        nv.Backend(getattr(nv.BackendKind, k)) for k in ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")
    ]


if __name__ == "__main__":
    sys.exit(main())

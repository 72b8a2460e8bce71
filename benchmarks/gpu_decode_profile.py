"""Where the GPU decode's time goes: nvImageCodec's batched decode alone, with whole images and
with the crop windows aioloader asks for, against aioloader's own batch decoder and its
host-side parts, on the same batches (RESULTS §29: ``ImageDecoder(224, crop="random",
hflip=True, device="cuda")`` fed 0.54x DataLoader, its transfer thread spending 226-241 ms of
CPU a batch for about 128 GPU-decoded samples). GPU only: skips cleanly (exit 0) without
CUDA or nvImageCodec; asserts nothing about time.

Data: ``--images`` JPEGs of 500x375 made in memory as ``gpu_train.py`` makes its folder
(``aioloader.synthetic.make_image``, Pillow, quality 90, 4:2:0), their windows and flips drawn
as the loader's device stage draws them (``ImageDecoder.window`` from ``(seed, epoch 0,
index)``), cut into batches of ``--batch``. Each stage runs once to warm up, then
``--repeats`` times over those batches in turn; medians per batch:

- ``call ms``: the call's wall time (it returns once its host side is done); ``done ms``: up
  to the stream's completion (the GPU side too); ``proc CPU ms``: the whole process's CPU
  during the call (nvImageCodec's own threads included: a thread a native library starts
  takes its creator's name, so the benchmark's per-thread table counts them as the
  transfer thread); ``thread CPU ms``: the calling thread's alone; the same per sample;
  ``None``: the images given back as None (refused or failed).

Stages:

- ``a nvimgcodec whole``: ``Decoder.decode`` of the batch's code streams, whole images,
  aioloader's options (``:fancy_upsampling=1``, one CPU thread); ``a2 ... gpu backends``: the
  same with only the GPU backends allowed (no CPU decoder to fall back on);
- ``b nvimgcodec roi``: the crop windows as aioloader made them in the §29 run
  (``NvImageCodecDecoder(roi=True)``'s sub-code-streams); ``b2 ... gpu backends``: how many
  the GPU decoders refuse (with nvJPEG < 13.2 they refuse a window of a 4:2:0 JPEG under
  fancy upsampling); ``b3 ... enable_roi_fancy_upsampling=1``: the same windows allowed;
  ``b4 ... all CPU threads``: the default backends with ``max_num_cpu_threads=0``, to see
  whether the time scales with CPU threads (a CPU decode);
- ``c aioloader whole`` and ``c2 aioloader roi``: ``NvImageCodecDecoder.decode``, the call the
  transfer thread makes (whole images is the default since this script), into a
  ``(batch, 3, 224, 224)`` tensor;
- ``d host prep whole`` / ``d2 host prep roi``: its host-side preparation alone (parsing the
  code streams, making the windows, Pillow's taps), as ``decode`` does it;
- ``e finish loop``: its per-image crop, resize and flip on the GPU alone, over images
  decoded beforehand (whole).

Then cProfile's top 25 by cumulative time of ``c`` and ``c2``, a few batches each, and the
nvJPEG libraries the process loaded (``/proc/self/maps``). Which nvJPEG nvImageCodec gets
depends on what was loaded first: torchvision's wheels carry their own ``libnvjpeg``, and
``gpu_train.py`` imports torchvision before nvImageCodec loads its JPEG extension; the one
``aioloader[gpu]`` installs (``nvidia-nvjpeg``, 13.3 here) accepts the windows.
``--torchvision auto`` (the default) imports torchvision first where it is installed, as
``gpu_train.py`` does; ``no`` leaves it out.

    python benchmarks/gpu_decode_profile.py [--images 512] [--batch 128] [--repeats 5] [--seed 0]
                                            [--torchvision auto|no]
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SIZE = (500, 375)  # gpu_train.py's images
OUT = 224  # ImageDecoder(224, crop="random", hflip=True)
OPTIONS = ":fancy_upsampling=1"  # aioloader's (NvImageCodecDecoder.start)
ROI_ON = OPTIONS + " :enable_roi_fancy_upsampling=1"
PREFIX = "gpu_decode_profile"


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
    from aioloader.decode.ondevice import sample_generator

    boxes, flips = [], []
    for i, data in enumerate(datas):
        header = jpeg_header(data)
        assert header is not None, f"image {i} is no JPEG"
        box, flip = decoder.window(header.width, header.height, lambda i=i: sample_generator(seed, 0, i))
        boxes.append(box)
        flips.append(flip)
    return np.array(boxes, dtype=np.float64).reshape(-1, 4), np.array(flips, dtype=np.bool_)


@dataclass
class Stage:
    """One stage's measurements, a row per repeat (milliseconds), ``nones`` per repeat."""

    name: str
    samples: int
    call: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    proc: list[float] = field(default_factory=list)
    thread: list[float] = field(default_factory=list)
    nones: list[int] = field(default_factory=list)
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
        stage.error = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        traceback.print_exc(file=sys.stderr)
    return stage


def table(stages: Sequence[Stage]) -> str:
    """The stages as a markdown table: medians per batch and per sample."""
    head = "| stage | call ms | done ms | proc CPU ms | thread CPU ms | ms/sample (done) | proc CPU ms/sample | None |"
    lines = [head, "| --- " + "| ---: " * 7 + "|"]
    for s in stages:
        m = s.medians()
        if s.error is not None or not m:
            lines.append(f"| {s.name} | n/a: {s.error or 'no run'} |" + " |" * 6)
            continue
        n = max(s.samples, 1)
        lines.append(
            f"| {s.name} | {m['call']:.1f} | {m['done']:.1f} | {m['proc']:.1f} | {m['thread']:.1f} "
            f"| {m['done'] / n:.3f} | {m['proc'] / n:.3f} | {max(s.nones, default=0)} |"
        )
    return "\n".join(lines)


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


def prepare(dec: Any, datas: Sequence[memoryview], boxes: np.ndarray) -> tuple[list[Any], tuple[Any, ...]]:
    """``NvImageCodecDecoder.decode``'s host side before the decode, as it does it: the parsed
    ``(position, code stream, window)`` and Pillow's taps (x index, x weights, y ...)."""
    from aioloader.decode.nvimgcodec import _taps

    found = [(i, dec._parse(d, boxes[i])) for i, d in enumerate(datas)]
    parsed = [(i, *f) for i, f in found if f is not None]
    windows = np.array([w for _, _, w in parsed], dtype=np.float64)
    inner = np.asarray(boxes, dtype=np.float64)[[i for i, _, _ in parsed]] - windows[:, [0, 1, 0, 1]]
    sizes = windows[:, 2:] - windows[:, :2]
    x = _taps(inner[:, 0], inner[:, 2], sizes[:, 0], dec._width, dec._resample)
    y = _taps(inner[:, 1], inner[:, 3], sizes[:, 1], dec._height, dec._resample)
    return parsed, (*x, *y)


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
    if args.batch < 1 or args.images < args.batch or args.repeats < 1:
        p.error("need 1 <= --batch <= --images and --repeats >= 1")
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
    return run(args, nv, device, stream, stream.synchronize)


def run(args: argparse.Namespace, nv: Any, device: Any, stream: Any, sync: Callable[[], None]) -> int:
    """The stages (see the module docstring) on ``device``, ordered on ``stream``."""
    import torch

    from aioloader import ImageDecoder
    from aioloader.decode.nvimgcodec import NvImageCodecDecoder

    t0 = time.perf_counter()
    datas = make_jpegs(args.images, args.seed)
    decoder = ImageDecoder(OUT, crop="random", hflip=True)
    boxes, flips = draw_windows(datas, decoder, args.seed)
    print(
        f"# data: {len(datas)} JPEGs {SIZE[0]}x{SIZE[1]}, {sum(map(len, datas)) / len(datas) / 1e3:.0f} KB "
        f"mean, made in {time.perf_counter() - t0:.1f} s; batch {args.batch}",
        flush=True,
    )
    nb = len(datas) // args.batch
    spans = [range(k * args.batch, (k + 1) * args.batch) for k in range(nb)]
    views = [[memoryview(datas[i]) for i in s] for s in spans]
    bbox = [boxes[s.start : s.stop] for s in spans]
    bflip = [flips[s.start : s.stop] for s in spans]
    whole = NvImageCodecDecoder(device, OUT, OUT, decoder.resample)
    roi = NvImageCodecDecoder(device, OUT, OUT, decoder.resample, roi=True)
    for d in (whole, roi):
        d.start()
    index = device.index or 0
    codes = {
        name: [[c for _, c, _ in prepare(d, views[k], bbox[k])[0]] for k in range(nb)]
        for name, d in (("whole", whole), ("roi", roi))
    }
    out = torch.empty((args.batch, 3, OUT, OUT), dtype=torch.uint8, device=device)
    rows = list(out)

    def nv_stage(name: str, kind: str, **kw: Any) -> Stage:
        try:
            kw = {k: v() if callable(v) else v for k, v in kw.items()}  # backends: made here
            dec = nv.Decoder(device_id=index, **{"max_num_cpu_threads": 1, "options": OPTIONS, **kw})
        except Exception as e:  # noqa: BLE001 - reported in the table
            return Stage(name, args.batch, error=f"Decoder: {type(e).__name__}: {e}"[:160])
        params = whole._params
        return time_stage(
            name,
            lambda k: list(dec.decode(codes[kind][k], params=params, cuda_stream=stream.cuda_stream)),
            nb,
            args.repeats,
            args.batch,
            sync,
        )

    gpu_only = _gpu_backends(nv)
    stages = [
        nv_stage("a nvimgcodec whole", "whole"),
        nv_stage("a2 nvimgcodec whole, gpu backends", "whole", backends=gpu_only),
        nv_stage("b nvimgcodec roi", "roi"),
        nv_stage("b2 nvimgcodec roi, gpu backends", "roi", backends=gpu_only),
        nv_stage("b3 nvimgcodec roi, enable_roi_fancy_upsampling=1", "roi", options=ROI_ON),
        nv_stage("b4 nvimgcodec roi, all CPU threads", "roi", max_num_cpu_threads=0),
    ]
    for name, d in (("c aioloader whole", whole), ("c2 aioloader roi", roi)):
        stages.append(
            time_stage(
                name,
                lambda k, d=d: d.decode(views[k], bbox[k], bflip[k], rows, stream),
                nb,
                args.repeats,
                args.batch,
                sync,
            )
        )
    for name, d in (("d host prep whole", whole), ("d2 host prep roi", roi)):
        stages.append(
            time_stage(name, lambda k, d=d: prepare(d, views[k], bbox[k]), nb, args.repeats, args.batch, sync)
        )
    stages.append(finish_stage(whole, views, bbox, bflip, rows, stream, args, sync))
    print(table(stages), flush=True)
    print(f"\n# nvJPEG libraries loaded: {', '.join(loaded_libraries()) or 'none found'}", flush=True)
    for name, d in (("c aioloader whole", whole), ("c2 aioloader roi", roi)):

        def batches(d: Any = d) -> None:
            for k in range(args.profile_batches):
                d.decode(views[k % nb], bbox[k % nb], bflip[k % nb], rows, stream)
            sync()

        print(
            f"\n## cProfile, {name}: {args.profile_batches} batches of {args.batch}, top 25 by cumulative time\n"
        )
        print(top_profile(batches), flush=True)
    for d in (whole, roi):
        d.close()
    print(f"# {PREFIX}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def finish_stage(
    dec: Any,
    views: list[list[memoryview]],
    bbox: list[np.ndarray],
    bflip: list[np.ndarray],
    rows: list[Any],
    stream: Any,
    args: argparse.Namespace,
    sync: Callable[[], None],
) -> Stage:
    """``e``: the per-image crop, resize and flip of ``dec.decode`` alone, over images
    decoded (whole) beforehand, batch 0's."""
    import torch

    try:
        parsed, taps = prepare(dec, views[0], bbox[0])
        images = dec._decode_all([c for _, c, _ in parsed], stream)
        sync()
    except Exception as e:  # noqa: BLE001 - reported in the table
        return Stage("e finish loop", args.batch, error=f"{type(e).__name__}: {e}"[:160])
    device = rows[0].device

    def finish(_: int) -> None:
        with torch.cuda.stream(stream) if device.type == "cuda" else _null():
            xi, xw, yi, yw = (torch.from_numpy(a).to(device, non_blocking=True) for a in taps)
            for j, (i, _, w) in enumerate(parsed):
                if images[j] is not None:
                    dec._finish(
                        images[j],
                        (w[3] - w[1], w[2] - w[0]),
                        (xi[j], xw[j]),
                        (yi[j], yw[j]),
                        bool(bflip[0][i]),
                        rows[i],
                    )

    return time_stage("e finish loop", finish, 1, args.repeats, args.batch, sync)


def _gpu_backends(nv: Any) -> Callable[[], list[Any]]:
    """The GPU backends (hardware engine, CUDA, hybrid), no CPU decoder: a call, so that a
    library without them fails in its stage, not here."""
    return lambda: [
        nv.Backend(getattr(nv.BackendKind, k)) for k in ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")
    ]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())

"""The largest batch that loads when /dev/shm is Docker's default 64 MB: aioloader
(in the trainer's process and with ``loader_process=True``) against
``torch.utils.data.DataLoader(num_workers=2)``, in the same run.

The script re-runs itself under ``unshare -m`` with a tmpfs of ``--shm`` (default 64m) on
/dev/shm, a private mount namespace (needs root or CAP_SYS_ADMIN; the machine's own /dev/shm
is untouched). There, for each loader, it tries batch sizes in a doubling ladder from
``--start`` up to ``--max-batch`` and then bisects between the last size that loaded and
the first that did not, down to one sample. A size *loads* when ``--batches`` batches come
out (default 3; 20 is a sustained run, where the slabs a pipeline keeps are all in use;
the files repeat past the first 3 batches' worth); each try is a fresh Python process (a bus error or a hang is that try's failure, ``--timeout``
seconds at most). Samples are 224x224x3 uint8 images made by a plain decode function of
the user's own (the file's number as an image; no ``output_shape`` declared) from files of
``--file-kb`` (default 100, a JPEG of the benchmark's 500x375 images; aioloader's slabs also
hold the batch's file bytes, DataLoader's shared memory only its output), ``prefetch=2`` (DataLoader: its default ``prefetch_factor=2`` per worker),
everything else at its default. Asserts nothing.

    sudo python benchmarks/shm_limit.py [--shm 64m] [--start 8] [--max-batch 1024] [--file-kb 100]
                                        [--batches 3] [--kinds aioloader,aioloader-process,dataloader]

Run it with the checkout under test first on the path (``PYTHONPATH=. python
benchmarks/shm_limit.py``); the report names the aioloader it imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KINDS = ("aioloader", "aioloader-process", "dataloader")
SHAPE = (224, 224, 3)
FILES_PER_SIZE = 3  # distinct files: 3 batches' worth of the largest size; longer runs repeat them


def decode(data: bytes) -> np.ndarray:
    """A plain user decode: the number the file starts with, as a 224x224x3 uint8 image."""
    return np.full(SHAPE, int(data[:12]) % 251, dtype=np.uint8)


class Files:
    """DataLoader's Dataset over the same files, with the same decode."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        with open(self.paths[i], "rb") as f:
            return decode(f.read())


def trial(kind: str, batch: int, batches: int, folder: str) -> None:
    """One try, in a process of its own: print ``ok`` once ``batches`` batches of ``batch``
    came out (one epoch of exactly that many)."""
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    paths = [files[i % len(files)] for i in range(batches * batch)]
    got = 0
    if kind == "dataloader":
        from torch.utils.data import DataLoader

        for b in DataLoader(Files(paths), batch_size=batch, num_workers=2):
            assert tuple(b.shape) == (batch, *SHAPE)
            got += 1
            if got == batches:
                break
    else:
        import aioloader

        with aioloader.Loader(
            paths, batch_size=batch, decode=decode, prefetch=2, loader_process=kind == "aioloader-process"
        ) as loader:
            for b in loader:
                assert tuple(b.shape) == (batch, *SHAPE)
                got += 1
                if got == batches:
                    break
    print("ok", flush=True)


def attempt(
    kind: str, batch: int, args: argparse.Namespace, folder: str, left: list[str]
) -> tuple[bool, str]:
    """``(loaded, why not)`` of one try in a fresh process. What the try leaves in /dev/shm
    goes into ``left`` and is removed, so it takes no room from the next try."""
    before = set(os.listdir("/dev/shm"))
    cmd = [sys.executable, os.path.abspath(__file__), "--trial", kind, str(batch), str(args.batches), folder]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return False, f"no {args.batches} batches within {args.timeout:.0f} s"
    finally:
        time.sleep(0.2)  # a resource tracker cleans up just after its process ends
        for name in sorted(set(os.listdir("/dev/shm")) - before):
            left.append(name)
            os.unlink(os.path.join("/dev/shm", name))
    if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
        return True, ""
    last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return False, (last[-1] if last else f"exit code {proc.returncode}")[:240]


def search(
    kind: str, args: argparse.Namespace, folder: str, left: list[str]
) -> tuple[int, int | None, str, int]:
    """``(largest size that loads, smallest that does not or None, why, tries)``; what the
    tries left in /dev/shm goes into ``left``."""
    tries = 0
    ok, bad, why = 0, None, ""
    size = args.start
    while size <= args.max_batch:  # doubling ladder
        tries += 1
        loaded, reason = attempt(kind, size, args, folder, left)
        print(f"  {kind:<18} batch {size:>5}: {'loads' if loaded else 'fails: ' + reason}", flush=True)
        if not loaded:
            bad, why = size, reason
            break
        ok = size
        size *= 2
    while bad is not None and bad - ok > 1:  # bisect
        mid = (ok + bad) // 2
        tries += 1
        loaded, reason = attempt(kind, mid, args, folder, left)
        print(f"  {kind:<18} batch {mid:>5}: {'loads' if loaded else 'fails: ' + reason}", flush=True)
        if loaded:
            ok = mid
        else:
            bad, why = mid, reason
    return ok, bad, why, tries


def describe_aioloader() -> str:
    from userfns import git_describe  # benchmarks/ is on sys.path (inside())

    import aioloader

    root = Path(aioloader.__file__).resolve().parent.parent
    return f"aioloader from {root} (git {git_describe(root)})"


def inside(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import machine

    st = os.statvfs("/dev/shm")
    mib = 2**20
    sample = int(np.prod(SHAPE))
    print(f"# The largest batch that loads with a {st.f_blocks * st.f_frsize / mib:.0f} MiB /dev/shm")
    print(f"command: {args.command}")
    print(*machine(), sep="\n")
    print(f"- {describe_aioloader()}")
    print(
        f"- samples 224x224x3 uint8 ({sample / 1024:.0f} KiB; a batch of 64 is {64 * sample / mib:.1f} MiB), "
        f"files of {args.file_kb} KiB, prefetch 2, a size loads when {args.batches} batches come out; doubling from {args.start} to "
        f"{args.max_batch}, then bisection"
    )
    print(flush=True)
    with tempfile.TemporaryDirectory(prefix="shm-limit-", dir=args.data_dir) as folder:
        pad = b" " * max(0, args.file_kb * 1024 - 12)
        for i in range(FILES_PER_SIZE * args.max_batch):
            with open(os.path.join(folder, f"{i:06d}.bin"), "wb") as f:
                f.write(f"{i:<12d}".encode() + pad)
        rows = []
        for kind in args.kinds.split(","):
            left: list[str] = []
            ok, bad, why, tries = search(kind, args, folder, left)
            rows.append((kind, ok, bad, why, tries, left))
    print()
    print(
        "| loader | largest batch that loads | its batch MiB | first size that fails | why it fails | tries "
        "| files its tries left in /dev/shm (removed after each) |"
    )
    print("|---|---:|---:|---:|---|---:|---|")
    for kind, ok, bad, why, tries, left in rows:
        largest = f"**{ok}**" if bad is not None else f"**>= {ok}** (the search's cap)"
        fails = str(bad) if bad is not None else "-"
        mb = f"{ok * sample / mib:.1f}" if ok else "-"
        shown = why.replace("|", "\\|") if why else "-"
        names = sorted({n.rsplit("_", 2)[0] + "_*" if n.startswith("torch_") else n for n in left})
        print(
            f"| {kind} | {largest} | {mb} | {fails} | {shown} | {tries} | {len(left)} {' '.join(names[:4])} |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shm", default="64m", help="size of the tmpfs on /dev/shm (mount's size=)")
    p.add_argument("--start", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=1024)
    p.add_argument("--file-kb", type=int, default=100, help="size of each file read (KiB)")
    p.add_argument("--batches", type=int, default=3, help="a size loads when this many batches come out")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per try")
    p.add_argument("--data-dir", default=None, help="where the small files go (not /dev/shm)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--command", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trial", nargs=4, metavar=("KIND", "BATCH", "BATCHES", "FOLDER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trial:
        kind, batch, batches, folder = args.trial
        trial(kind, int(batch), int(batches), folder)
        return 0
    if args.inside:
        inside(args)
        return 0
    command = " ".join(["python", "benchmarks/shm_limit.py", *map(shlex.quote, sys.argv[1:])])
    mount = f"mount -t tmpfs -o size={shlex.quote(args.shm)} tmpfs /dev/shm"
    me = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--inside", "--command", command]
    cmd = ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"', *me]
    try:
        return subprocess.run(cmd).returncode
    except FileNotFoundError:
        print("needs unshare(1) (util-linux)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

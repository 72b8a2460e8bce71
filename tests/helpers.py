"""Picklable decoders and file builders shared by the tests (workers import this module)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aioloader import ImageDecoder


def script_env() -> dict[str, str]:
    """The environment for a Python subprocess a test starts: ``PYTHONPATH`` leads with the
    checkout whose aioloader this process imported, then tests/ (helpers, faults). Without
    it a script run from a temporary folder imports whichever aioloader an editable install
    points at, which from a git worktree or a clone is another checkout's."""
    import aioloader

    root = os.path.dirname(os.path.dirname(os.path.abspath(aioloader.__file__)))
    tests = os.path.dirname(os.path.abspath(__file__))
    parts = [root, tests, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def write_numbered_files(folder: Path, n: int) -> list[str]:
    """``n`` small real files whose content is their number, ``sample-000123``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"f{i:05d}.txt"
        p.write_bytes(f"sample-{i:06d}".encode())
        paths.append(os.fspath(p))
    return paths


def decode_number(data: bytes) -> np.ndarray:
    """``b"sample-000123"`` -> ``array([123])``; anything else raises ValueError."""
    text = data.decode()
    if not text.startswith("sample-"):
        raise ValueError(f"not a numbered file: {text[:20]!r}")
    return np.array([int(text[7:])], dtype=np.int64)


class FailOn:
    """Decode numbered files, raising ``exc_type(message)`` on the numbers in ``bad``."""

    def __init__(self, bad: set[int], exc_type: type[Exception] = ValueError) -> None:
        self.bad = bad
        self.exc_type = exc_type

    def __call__(self, data: bytes) -> np.ndarray:
        value = decode_number(data)
        if int(value[0]) in self.bad:
            boom(self.exc_type, f"bad sample {int(value[0])}")
        return value


def boom(exc_type: type[Exception], message: str) -> None:
    """A named frame, so tests can find it in the worker's traceback."""
    raise exc_type(message)


class SlowDecode:
    """Decode numbered files after sleeping ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, data: bytes) -> np.ndarray:
        time.sleep(self.seconds)
        return decode_number(data)


class ReadAfterTicks:
    """Read numbered files only once the test's event loop has ticked: a ticker there
    appends a byte to ``ticks`` per tick, and the test appends a line to ``arrivals`` (the
    ticks so far) when it starts to wait for the first batch and as each batch arrives.
    The file numbered ``i``, of batch ``b = i // batch_size``, is returned once ``ticks``
    holds ``k`` ticks past line ``b``: a loader that blocked the test's loop while it waited
    for a batch would never see them. Reads run on threads of their own, so one held back
    holds back no other batch. After ``guard`` seconds it raises instead (a hang guard)."""

    def __init__(self, ticks: str, arrivals: str, batch_size: int, k: int, guard: float = 30.0) -> None:
        self.ticks, self.arrivals = ticks, arrivals
        self.batch_size, self.k, self.guard = batch_size, k, guard

    def __call__(self, path: str) -> bytes:
        with open(path, "rb") as f:
            data = f.read()
        b = int(decode_number(data)[0]) // self.batch_size
        deadline = time.monotonic() + self.guard
        while True:
            with open(self.arrivals) as f:
                lines = f.read().split("\n")[:-1]  # whole lines only
            if len(lines) > b and os.path.getsize(self.ticks) >= int(lines[b]) + self.k:
                return data
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path}: the test's loop did not tick {self.k} times")
            time.sleep(0.002)


class FakeClock:
    """A clock that moves only when the test moves it: the ``clock=`` of a stage meter, the
    counters or the tuner in a pure test. Steps that are binary fractions (0.25, 1/64) keep
    every sum exact, so figures compare with ``==``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LoggedRead:
    """A read hook that appends a line to the file ``log`` for each file it reads (one small
    append: whole lines from any thread or process), so a test counts reads from outside;
    the files in ``slow`` take ``seconds`` longer."""

    def __init__(self, log: str, slow: frozenset[str] = frozenset(), seconds: float = 0.0) -> None:
        self.log = log
        self.slow = slow
        self.seconds = seconds

    def __call__(self, path: str) -> bytes:
        if path in self.slow:
            time.sleep(self.seconds)
        with open(self.log, "a") as f:
            f.write(os.path.basename(path) + "\n")
        return Path(path).read_bytes()


def random_draw(data: bytes) -> np.ndarray:
    """The number and one draw of aioloader.sample_rng() (seeded by seed, epoch, index)."""
    import aioloader

    return np.array([float(decode_number(data)[0]), aioloader.sample_rng().random()])


def flatten(batches: list[object]) -> list[int]:
    """Sample numbers in delivery order, from batches of decode_number samples."""
    out: list[int] = []
    for b in batches:
        values = b[0] if isinstance(b, (tuple, list)) else b
        out.extend(int(v) for v in values.reshape(-1).tolist())  # type: ignore[attr-defined]
    return out


class FixedShape:
    """Decode numbered files to a (2, 3) uint8 array filled with the number (mod 256), and
    declare that shape, so the loader uses the shared-memory slab path. Numbers in ``odd``
    come out with a different shape: they cannot go into a slab."""

    output_shape = (2, 3)
    output_dtype = np.uint8

    def __init__(self, odd: frozenset[int] = frozenset()) -> None:
        self.odd = odd

    def __call__(self, data: bytes) -> np.ndarray:
        n = int(decode_number(data)[0])
        shape = (4,) if n in self.odd else self.output_shape
        return np.full(shape, n % 256, dtype=np.uint8)


def write_sized_files(folder: Path, sizes: list[int]) -> list[str]:
    """Files of the given sizes whose first bytes are their number (``sample-000007``)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, size in enumerate(sizes):
        head = f"sample-{i:06d}".encode()
        p = folder / f"s{i:05d}.bin"
        p.write_bytes(head + b" " * max(0, size - len(head)))
        paths.append(os.fspath(p))
    return paths


def decode_head(data: bytes) -> np.ndarray:
    """Like decode_number, but for files padded past their number (write_sized_files)."""
    return decode_number(data[:13]) * 0 + np.array([int(data[7:13]), len(data)], dtype=np.int64)


# -- damaged image files ----------------------------------------------------------------------


def jpeg_scan(data: bytes) -> tuple[int, int]:
    """Where a baseline JPEG's entropy-coded data lies: from the end of its (only) start-of-
    scan header to its end-of-image marker."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big"), data.rindex(b"\xff\xd9")


def overwrite_scan(data: bytes, at: float, new: bytes) -> bytes:
    """``data`` with ``new`` written over its entropy-coded data, ``at`` (0..1) of the way
    in; the headers and the end-of-image marker stay intact."""
    start, end = jpeg_scan(data)
    pos = start + int((end - start) * at)
    assert start < pos and pos + len(new) < end, "the bytes must land inside the scan"
    return data[:pos] + new + data[pos + len(new) :]


def scan_garbage(n: int, seed: int = 0) -> bytes:
    """``n`` random bytes without 0xFF: garbage the decoder reads as compressed data (0xFF
    would begin a marker, a different damage)."""
    values = np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)  # 0..254
    return values.tobytes()


# A start-of-frame marker where compressed data belongs: libjpeg stops with an error.
MARKER_IN_SCAN = b"\xff\xc0\x00\x11"


def shm_segments(pid: int | None = None) -> set[str]:
    """The names of aioloader's shared-memory slabs that process ``pid`` (default: this one)
    made and still shares: its ``/dev/shm/aioloader-<pid>-*`` files (the fallback) and the
    ``/memfd:aioloader-<pid>-*`` descriptors it holds open (memfd slabs: gone with the
    descriptor). Names start with their maker's pid, so loaders in other processes on the
    same machine (a parallel test run) do not count."""
    pid = os.getpid() if pid is None else pid
    prefix = f"aioloader-{pid}-"
    try:
        names = {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:
        names = set()
    return names | memfd_slabs(pid)


def memfd_slabs(pid: int | None = None, maker: int | None = None) -> set[str]:
    """Names of the aioloader memfd slabs that process ``pid`` (default: this one) holds a
    descriptor of, made by process ``maker`` (default: ``pid``; 0: any)."""
    pid = os.getpid() if pid is None else pid
    maker = pid if maker is None else maker
    prefix = f"/memfd:aioloader-{maker}-" if maker else "/memfd:aioloader-"
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to see
        return set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith(prefix):
            out.add(_slab_name(link))
    return out


def memfd_holders(makers: set[int]) -> set[str]:
    """``"<pid>:<slab name>"`` for every process on this machine that holds a descriptor or
    a mapping of a memfd slab made by one of ``makers``: a memfd lives exactly as long as
    one of those, so this is what a dead loader could leave (there is no name to leak)."""
    prefixes = tuple(f"/memfd:aioloader-{m}-" for m in makers)
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = _fd_links(entry) + _mapped_paths(entry)
        except OSError:  # gone meanwhile, or not ours to see
            continue
        out |= {f"{entry}:{_slab_name(x)}" for x in links if x.startswith(prefixes)}
    return out


def slab_holdings(pids: set[int]) -> set[str]:
    """``"<pid> (<name>) fd|maps <slab name>"`` for each descriptor and each mapping of an
    aioloader slab (memfd or ``/dev/shm``, whoever made it) that the processes ``pids``
    hold, from /proc/<pid>/fd and /proc/<pid>/maps. A memfd slab lives as long as one of
    those: what the zygote, a fork server or a worker still holds after a loader closed is
    memory nobody frees until that process ends. Processes gone meanwhile are skipped."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                who = f"{pid} ({f.read().strip()})"
            fds = [x for x in _fd_links(pid) if x.startswith(_SLAB_PATHS)]
            maps = [x for x in _mapped_paths(pid) if x.startswith(_SLAB_PATHS)]
        except OSError:  # gone meanwhile, or not ours to see
            continue
        out |= {f"{who} fd {_slab_name(x)}" for x in fds}
        out |= {f"{who} maps {_slab_name(x)}" for x in maps}
    return out


#: How a slab shows in /proc/<pid>/fd links and /proc/<pid>/maps.
_SLAB_PATHS = ("/memfd:aioloader-", "/dev/shm/aioloader-")


def _fd_links(pid: int | str) -> list[str]:
    """Where process ``pid``'s descriptors point (those closed meanwhile left out); raises
    OSError when the process is gone or not ours to see."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def _mapped_paths(pid: int | str) -> list[str]:
    """The paths of process ``pid``'s file mappings, from /proc/<pid>/maps."""
    with open(f"/proc/{pid}/maps") as f:
        return [parts[5] for parts in (line.rstrip("\n").split(maxsplit=5) for line in f) if len(parts) == 6]


#: aioloader's names in /dev/shm, with their maker's pid: the slabs' fallback segments
#: (``aioloader-<pid>-<n>-<random>``) and the decode pools' semaphores
#: (``sem.mp-aioloader-<pid>-<random>``).
_SHM_NAME = re.compile(r"^(?:aioloader|sem\.mp-aioloader)-(\d+)-")


def shm_entries() -> dict[str, int]:
    """Every aioloader entry in /dev/shm, whoever made it (another test run's too), with
    the pid of the process that made it (its name carries it): ``/dev/shm`` slabs and
    the decode pools' multiprocessing semaphores."""
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        m = _SHM_NAME.match(name)
        if m:
            out[name] = int(m.group(1))
    return out


def _slab_name(path: str) -> str:
    """``aioloader-<pid>-<n>-<random>`` from a maps or fd-link path of a slab."""
    return os.path.basename(path.removeprefix("/memfd:")).removesuffix(" (deleted)")


def slab_mappings(maker: int | None = None) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of this process's mappings of aioloader slabs made by process
    ``maker`` (default: any), memfd (``/memfd:aioloader-...``) or ``/dev/shm`` alike, from
    /proc/self/maps; also once the slab is closed, while still mapped."""
    tail = f"aioloader-{maker}-" if maker is not None else "aioloader-"
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith((f"/dev/shm/{tail}", f"/memfd:{tail}")):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, _slab_name(parts[5])))
    return out


def new_shm_entries(before: Collection[str], makers: Collection[int]) -> set[str]:
    """aioloader's entries in /dev/shm (:func:`shm_entries`: slabs, semaphores) that are not
    in ``before`` and were made by one of ``makers`` or by a process that no longer exists
    (a loader process that exited leaving them; its pid cannot be checked any more).
    Entries of running processes outside ``makers`` are another run's (a benchmark, a
    colleague's tests on the same machine), which makes and removes them meanwhile."""
    return {
        name
        for name, maker in shm_entries().items()
        if name not in before and (maker in makers or is_gone(maker))
    }


# -- decoders with undeclared outputs (the zero-copy path learns their layout) ----------------


def number_image(data: bytes) -> np.ndarray:
    """A plain user function: the number as a (3, 4, 5) uint8 array, nothing declared."""
    return np.full((3, 4, 5), int(decode_number(data)[0]) % 256, dtype=np.uint8)


def number_tensor(data: bytes) -> Any:
    """The number as a (2, 3) float32 torch tensor (the worker imports torch for it)."""
    import torch

    return torch.full((2, 3), float(decode_number(data)[0]))


def number_dict(data: bytes) -> dict[str, Any]:
    """A nested sample: arrays beside numbers, a string and None."""
    n = int(decode_number(data)[0])
    return {
        "image": np.full((2, 2), n, dtype=np.int32),
        "meta": {"n": n, "half": n / 2, "name": f"s{n}", "none": None},
        "pair": (np.arange(3, dtype=np.float64) + n, n % 2 == 0),
    }


def number_ragged(data: bytes) -> np.ndarray:
    """Shapes vary: ``n % 4 + 1`` rows of the number (needs a custom collate)."""
    n = int(decode_number(data)[0])
    return np.full((n % 4 + 1, 2), n, dtype=np.int16)


class FailingImage:
    """number_image, raising ValueError on the numbers in ``bad``."""

    def __init__(self, bad: frozenset[int]) -> None:
        self.bad = bad

    def __call__(self, data: bytes) -> np.ndarray:
        if int(decode_number(data)[0]) in self.bad:
            boom(ValueError, "bad sample")
        return number_image(data)


class WhereDecoded(ImageDecoder):
    """The built-in ``ImageDecoder`` (an instance of it, so the loader treats it as one, hot
    start included) whose samples also say which process decoded them: ``(image, pid)``.

    Holds the decode workers back: a worker unpickles its decoder once, as it starts, and
    this one waits there, in a process named ``aioloader-work`` (a decode worker), until the file ``gate``
    exists; then it writes ``<gate>.<pid>`` and the worker starts. The loader's own process
    unpickles it without waiting."""

    output_shape = None  # type: ignore[assignment]  # the samples are (image, pid): learned, not declared

    def __init__(self, size: int, gate: str) -> None:
        super().__init__(size)
        self.gate = gate

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if process_name(os.getpid()) == "aioloader-work":  # a decode worker
            while not os.path.exists(self.gate):
                time.sleep(0.005)
            Path(f"{self.gate}.{os.getpid()}").touch()

    def __call__(self, data: bytes) -> tuple[np.ndarray, int]:  # type: ignore[override]
        return super().__call__(data), os.getpid()


# -- observing a loader from outside: its processes and shared memory ----------------------
# (tests check what a loader started through /proc and /dev/shm, never its internals)


def process_name(pid: int) -> str:
    """``/proc/<pid>/comm``: what ``ps`` and ``top`` show (15 bytes at most), or "" once gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def named(name: str) -> set[int]:
    """This process's live descendants named ``name`` in ``/proc/<pid>/comm``."""
    return {pid for pid in process_tree() if process_name(pid) == name}


def shared_helper_pids() -> set[int]:
    """The process-wide helpers: aioloader's zygote and multiprocessing's fork server (the
    workers' parent) and resource tracker, and the tests' loopback servers (servers.py).
    They outlive every loader by design."""
    from multiprocessing import forkserver, resource_tracker

    from aioloader.procs import zygote

    pids = set()
    fs = getattr(forkserver._forkserver, "_forkserver_pid", None)
    rt = getattr(resource_tracker._resource_tracker, "_pid", None)
    for pid in (fs, rt, zygote.pid()):
        if pid:
            pids.add(pid)
    servers = sys.modules.get("servers")  # the remote-storage tests' loopback servers
    if servers is not None:
        pids |= servers.RUNNING
    return pids


def _proc_stat(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_tree() -> set[int]:
    """Live (non-zombie) descendants of this process, from the ppid chains in /proc. A
    loader's workers are among them however they were started: children of the fork server
    (so grandchildren of this process) or, with ``spawn``, children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _proc_stat(entry)
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def descendants() -> set[int]:
    """:func:`process_tree` less the process-wide helpers (:func:`shared_helper_pids`)."""
    return process_tree() - shared_helper_pids()


def is_gone(pid: int) -> bool:
    """``pid`` has exited (no such process, or a zombie waiting to be reaped)."""
    fields = _proc_stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def shm_mapping(tensor: object, maker: int | None = None) -> str | None:
    """The name of the aioloader slab made by process ``maker`` (default: this one; a loader
    process's pid for its batches) that ``tensor``'s memory lies in (a memfd mapping,
    ``/memfd:aioloader-<maker>-...``, or a ``/dev/shm/aioloader-<maker>-...`` one; from
    /proc/self/maps, also once the slab is closed, while still mapped), or None for memory
    of its own (a copy) or another process's slab."""
    ptr = tensor.untyped_storage().data_ptr()  # type: ignore[attr-defined]
    for start, end, name in slab_mappings(os.getpid() if maker is None else maker):
        if start <= ptr < end:
            return name
    return None


# -- Ray's own processes, threads and descriptors (decode_on="ray") ------------------------
# While this process is connected to Ray (test_ray*.py), Ray runs processes of its own under
# it (gcs_server, raylet, its agents, its workers ``ray::IDLE``/``ray::decode_task``, started
# as it likes) and keeps threads and descriptors of its own (gRPC sockets, pipes, epoll,
# eventfd and timerfd inodes, log files in its session folder), made lazily and kept until
# ``ray.shutdown()``. The leak check (conftest.py) leaves those out, and only those, only
# while Ray is connected: aioloader's threads, slabs, /dev/shm entries and regular files are
# still counted, and so is a slab held by any process of the tree, Ray's workers included.


def ray_connected() -> bool:
    """This process is connected to a Ray cluster (``ray.init`` ran, no ``ray.shutdown``
    since); False where Ray was never imported."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def ray_processes(pids: Collection[int]) -> set[int]:
    """Those of ``pids`` that are Ray's own, by /proc/<pid>/cmdline: a program or a script
    inside the installed ``ray`` package (gcs_server, raylet, log_monitor.py, dashboard.py,
    ...) or a process that names itself ``ray::...`` (its workers and agents)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return set()
    package = os.path.dirname(os.path.realpath(ray.__file__)) + os.sep
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:  # gone meanwhile
            continue
        if args and (
            args[0].startswith("ray::") or any(os.path.realpath(a).startswith(package) for a in args[:2])
        ):
            out.add(pid)
    return out


def is_ray_thread(thread: threading.Thread) -> bool:
    """A Python thread Ray started: its class or its target lives in the ``ray`` package
    (``PythonGCThread``, ``ray_listen_error_messages``, ...). aioloader's (``aioloader-*``)
    never do."""
    target = getattr(thread, "_target", None)
    modules = (type(thread).__module__, getattr(target, "__module__", None) or "")
    return any(m == "ray" or m.startswith("ray.") for m in modules)


#: How Ray's own descriptors show in /proc/self/fd: its gRPC and object-store sockets, the
#: pipes and the epoll, eventfd and timerfd inodes of its event loops.
_RAY_FD_KINDS = ("socket:", "pipe:", "anon_inode:")


def is_ray_fd(link: str) -> bool:
    """Whether a descriptor of this process (``os.readlink`` of /proc/self/fd/N), taken while
    Ray is connected, is of a kind Ray keeps (:data:`_RAY_FD_KINDS`) or a file in Ray's
    session folder (its logs). A regular file, a memfd or /dev/shm slab is never one."""
    if link.startswith(_RAY_FD_KINDS):
        return True
    ray = sys.modules.get("ray")
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    session = getattr(node, "get_session_dir_path", None)
    return session is not None and link.startswith(session() + os.sep)


# -- scripts run in a session of their own ----------------------------------------------------


def start_script(
    path: Path,
    text: str,
    args: list[str] | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str | None] | None = None,
) -> subprocess.Popen[str]:
    """Write ``text`` to ``path`` and run it with this checkout's aioloader, in a session of
    its own (so what it leaves behind can be found, and killed, by session id). ``args``:
    the interpreter's arguments instead of ``[path]`` (``["../train.py"]``, ``["-m",
    "train"]``), run in ``cwd``. ``env``: variables set (a value) or unset (None) in the
    script's environment, from its start (before its first loader, as a user's would be)."""
    path.write_text(textwrap.dedent(text))
    environ = script_env()
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return subprocess.Popen(
        [sys.executable, *(args if args is not None else [str(path)])],
        cwd=cwd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish_script(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """``(stdout, stderr)`` of a script from :func:`start_script`; its whole session is
    killed past ``timeout``."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_session(proc)


def run_session(
    cmd: list[str], env: Mapping[str, str] | None = None, timeout: float = 100.0
) -> tuple[str, str]:
    """Run ``cmd`` in a session of its own to its end (a script under ``unshare -m``, say);
    ``(stdout, stderr)``, asserting it exited 0 with no traceback. What is left of the
    session is killed however it ends."""
    pipe = subprocess.PIPE
    proc = subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return out, err


#: A notebook test's driver script's lines (``os``, ``sys`` and ``json`` imported): register
#: a kernel spec that runs this interpreter under ``jupyter`` (the driver's variable, a folder)
#: and point Jupyter there, so the kernel is the Python under test. Not for ``.format``.
KERNEL_SPEC = """
spec = os.path.join(jupyter, "kernels", "aioloader-test")
os.makedirs(spec)
with open(os.path.join(spec, "kernel.json"), "w") as f:
    json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "aioloader test", "language": "python"}, f)
os.environ["JUPYTER_PATH"] = jupyter
"""


def kill_session(proc: subprocess.Popen[str]) -> None:
    """Kill what is left of a script's session and collect its output. The whole process
    group: an orphaned fork server or worker keeps the script's stdout and stderr open, and
    ``communicate`` would wait for them (a hung worker for as long as it hangs)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def session_survivors(session: int, seconds: float = 5.0) -> list[str]:
    """Pids still in ``session`` after waiting up to ``seconds`` for it to empty."""
    deadline = time.monotonic() + seconds
    while True:
        left = subprocess.run(["pgrep", "-s", str(session)], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# -- which runtime a loader ran in ------------------------------------------------------------

#: What ``start_runtime`` logs when a loader process cannot be made (a WARNING with
#: ``loader_process=True``, a DEBUG line with ``"auto"``).
NO_ZYGOTE = "no zygote can be made"


class RuntimeWatch:
    """The runtimes the loaders of a test started, against the one the test stands for
    (``[thread]`` or ``[process]``). Where no zygote can be made, ``loader_process=True``
    warns and loads in-process, and ``"auto"`` (the default) does so silently, as it does
    with a ``read`` or ``collate`` that cannot be sent: without this, a ``[process]`` test
    could pass as a ``[thread]`` one. :meth:`install` wraps ``start_runtime`` where the Loader calls it
    (``aioloader.loader``'s own name for it, and the defining module's) and listens on the
    ``aioloader`` logger; :meth:`problems` says what went wrong (conftest.py's ``runtimes``
    fixture fails the test with it)."""

    def __init__(self) -> None:
        #: ``(asked for a loader process, the runtime's class name)`` per runtime started;
        #: asked: ``config.build.start_in == "process"``, so for ``"auto"`` unless its callables
        #: could not be sent (then it loads in-process as asked).
        self.started: list[tuple[bool, str]] = []
        self.warnings: list[str] = []
        self.process: bool | None = None
        self.in_process_too = False
        self._handler: Any = None

    def expect(self, process: bool, *, in_process_too: bool = False) -> None:
        """The test stands for ``[process]`` (``process``) or ``[thread]``: every loader it
        starts must run there. ``in_process_too``: a ``[process]`` test that also starts
        loaders of its own in-process (say, to compare with); then each loader must run
        where it asked, and at least one in a loader process."""
        self.process = process
        self.in_process_too = in_process_too

    def install(self, monkeypatch: Any) -> None:
        import logging

        import aioloader.loader
        import aioloader.run.start

        original = aioloader.run.start.start_runtime
        # The Loader calls the name it imported: patching only the defining module would
        # watch nothing. Refuse to run unwatched if that import ever changes.
        assert aioloader.loader.start_runtime is original, "aioloader.loader no longer imports start_runtime"

        def watched(config: Any, *args: Any, **kwargs: Any) -> Any:
            runtime = original(config, *args, **kwargs)
            self.started.append((config.build.start_in == "process", type(runtime).__name__))
            return runtime

        monkeypatch.setattr(aioloader.run.start, "start_runtime", watched)
        monkeypatch.setattr(aioloader.loader, "start_runtime", watched)

        watch = self

        class Listen(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if NO_ZYGOTE in record.getMessage():
                    watch.warnings.append(record.getMessage())

        self._handler = Listen(logging.WARNING)
        logging.getLogger("aioloader").addHandler(self._handler)

    def uninstall(self) -> None:
        """Stop listening on the logger (the monkeypatch undoes the rest)."""
        import logging

        logging.getLogger("aioloader").removeHandler(self._handler)

    def problems(self) -> list[str]:
        """What ran where it was not asked to (empty: all as asked)."""
        if self.process is None:
            return []
        out = []
        kinds = [kind for _, kind in self.started]
        fell_back = [kind for asked, kind in self.started if asked and kind != "ProcessRuntime"]
        if self.process and fell_back:
            out.append(f"{len(fell_back)} loader(s) asked for a loader process and ran in-process")
        if self.process and not self.in_process_too and "Runtime" in kinds:
            out.append(f"[process] started in-process runtimes: {kinds}")
        if self.process and self.in_process_too and kinds and "ProcessRuntime" not in kinds:
            out.append(f"[process] started no loader process, only {kinds}")
        if not self.process and "ProcessRuntime" in kinds:
            out.append(f"[thread] started loader processes: {kinds}")
        if self.process and self.warnings:
            out.append(f"[process] logged: {self.warnings}")
        return out


def make_config(**kw: object) -> Any:
    """A validated ``LoaderConfig`` with small settings, ``kw`` overriding them (pure tests:
    no loader is started)."""
    from aioloader.config import LoaderConfig

    args: dict[str, object] = {
        "batch_size": 4,
        "decode": None,
        "collate": None,
        "shuffle": True,
        "seed": 3,
        "drop_last": False,
        "num_workers": 1,
        "io_concurrency": 4,
        "prefetch": 2,
        "ordered": True,
        "device": None,
        "pin_memory": None,
        "on_error": "raise",
        "max_failures": None,
    }
    args.update(kw)
    remote = bool(args.pop("remote", False))
    return LoaderConfig.create(args, remote=remote)


def lay_out_proc(tmp_path: Path, mountinfo: str, proc_cgroup: str, files: dict[str, str]) -> Path:
    """A ``/proc/<pid>`` laid out at ``tmp_path/proc`` with ``cgroup`` and ``mountinfo``, and
    ``files`` (paths as the mount points in ``mountinfo`` put them, under ``tmp_path``), for
    the cgroup readers (``aioloader.base.cpus``, ``aioloader.base.cgmemory``); returns it."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(proc_cgroup)
    for name, text in files.items():
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` imported as the module ``name`` (benchmarks/ is no package),
    so that tests can call its pure parts."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

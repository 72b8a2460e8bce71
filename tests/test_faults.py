"""Faults and bad input, on real files and real processes: each case ends in a clear error
or a counted skip, loses nothing else, and never hangs (tests/faults.py injects them)."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from faults import Fault, FlakyRead, SlowRead
from helpers import (
    MARKER_IN_SCAN,
    finish_script,
    flatten,
    kill_session,
    overwrite_scan,
    scan_garbage,
    script_env,
    session_survivors,
    shm_segments,
    start_script,
)
from PIL import Image

import aioloader
from aioloader import (
    DecodeError,
    FileDataset,
    Loader,
    LoaderError,
    LoaderTimeoutError,
    ReadError,
    SampleError,
    WorkerCrashedError,
)
from aioloader.synthetic import make_image_folder

ALL = list(range(37))


def run_epoch(loader: Loader) -> list[int]:
    return flatten(list(loader))


# -- bad files ---------------------------------------------------------------------------


@pytest.fixture
def jpegs(tmp_path: Path) -> FileDataset:
    root = make_image_folder(tmp_path / "img", num_images=12, num_classes=2, size=(64, 48))
    return FileDataset.from_folder(root)


def test_corrupt_jpeg_header(jpegs: FileDataset) -> None:
    bad = Path(jpegs.path(3))
    bad.write_bytes(b"\x00\x01garbage" + bad.read_bytes()[10:])
    with Loader(
        jpegs, batch_size=4, shuffle=False, decode=aioloader.ImageDecoder(16), num_workers=2
    ) as loader:
        with pytest.raises(DecodeError) as info:
            list(loader)
        assert info.value.path == str(bad) and "cannot identify image file" in str(info.value)
        assert "Traceback" in info.value.worker_traceback
        # Said by the file's size and first bytes, never by the repr of what Pillow read from.
        assert "starting b'\\x00\\x01garbage" in str(info.value)
        assert " object at 0x" not in str(info.value) + info.value.worker_traceback


def test_truncated_jpeg_never_gives_a_partial_image(jpegs: FileDataset) -> None:
    bad = Path(jpegs.path(5))
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with Loader(
        jpegs, batch_size=4, shuffle=False, decode=aioloader.ImageDecoder(16), num_workers=1
    ) as loader:
        with pytest.raises(DecodeError, match="truncated") as info:
            list(loader)
        assert info.value.index == 5 and info.value.path == str(bad)
        assert isinstance(info.value.__cause__, OSError)


def intact_decodes(ds: FileDataset, decode: aioloader.ImageDecoder) -> list[list[int]]:
    """Each file of ``ds`` decoded here, before any is damaged."""
    return [decode(Path(ds.path(i)).read_bytes()).tolist() for i in range(len(ds))]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_marker_inside_a_jpeg_scan_is_a_decode_error(jpegs: FileDataset, on_error: str) -> None:
    """Real corrupted data the decoder cannot go on with: a start-of-frame marker written
    into the middle of a valid JPEG's entropy-coded data, headers intact. A DecodeError
    naming the file, or a counted skip; the worker survives it, every other image is whole."""
    decode = aioloader.ImageDecoder(48)
    intact = intact_decodes(jpegs, decode)
    bad = Path(jpegs.path(5))
    bad.write_bytes(overwrite_scan(bad.read_bytes(), 0.5, MARKER_IN_SCAN))
    with Loader(
        jpegs, batch_size=4, shuffle=False, decode=decode, on_error=on_error, num_workers=1
    ) as loader:
        if on_error == "raise":
            with pytest.raises(DecodeError, match="broken data stream") as info:
                list(loader)
            assert info.value.index == 5 and info.value.path == str(bad)
            assert isinstance(info.value.__cause__, OSError)
            assert "Traceback" in info.value.worker_traceback
        else:
            images = [img.tolist() for x, _ in loader for img in x]
            assert images == intact[:5] + intact[6:]
            assert loader.stats.failures_by_reason == {"DecodeError": 1}
            assert loader.stats.last_failed_paths == (str(bad),)
        assert loader.stats.worker_restarts == 0  # an error in the worker, not a crash


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_garbage_in_a_jpeg_scan_arrives_damaged_without_an_error(jpegs: FileDataset, on_error: str) -> None:
    """Real corrupted data the decoder goes through: 64 random bytes (no 0xFF, so no marker)
    written over the middle of a valid JPEG's entropy-coded data, headers intact. libjpeg
    only warns about corrupt data and Pillow does not report warnings, so no error is
    possible: the sample arrives, identical to the intact file's above the damaged block
    row, wrong below; never a failure or a skip, never a crash (see ImageDecoder's docstring
    and test_decode.py)."""
    decode = aioloader.ImageDecoder(48)  # the 48x48 centre of a 64x48 image: pixels as decoded
    intact = intact_decodes(jpegs, decode)
    bad = Path(jpegs.path(5))
    bad.write_bytes(overwrite_scan(bad.read_bytes(), 0.6, scan_garbage(64)))
    with Loader(
        jpegs, batch_size=4, shuffle=False, decode=decode, on_error=on_error, num_workers=1
    ) as loader:
        images = [img.tolist() for x, _ in loader for img in x]
        stats = loader.stats
    assert stats.failures_by_reason == {} and stats.worker_restarts == 0
    assert len(images) == len(jpegs)
    assert images[:5] + images[6:] == intact[:5] + intact[6:]
    damaged, whole = np.array(images[5]), np.array(intact[5])
    wrong = np.flatnonzero((damaged != whole).any(axis=(0, 2)))
    assert wrong.size and wrong[0] > 0, "the rows above the damage are the intact file's"
    assert wrong.tolist() == list(range(int(wrong[0]), 48)), "and every row below it is wrong"


PILLOW_FLAG_SCRIPT = """
import json, sys
import numpy as np
from PIL import ImageFile
import aioloader

setting, runtime, folder = sys.argv[1:]
if setting == "set":
    ImageFile.LOAD_TRUNCATED_IMAGES = True  # where a training script sets it: at its top


def seen(data):  # the global, as the process that decodes a sample sees it
    return np.array([int(ImageFile.LOAD_TRUNCATED_IMAGES)])


def loader(dataset, **kw):
    return aioloader.Loader(
        dataset, batch_size=3, shuffle=False, num_workers=2, loader_process=runtime == "process", **kw
    )


if __name__ == "__main__":
    ds = aioloader.FileDataset.from_folder(folder)
    out = {}
    with loader(ds.paths[:4], decode=seen) as probe:  # (not an ImageDecoder: workers only)
        out["workers"] = sorted({int(v) for b in probe for v in b})
    if setting == "late":
        ImageFile.LOAD_TRUNCATED_IMAGES = True  # once a loader has started
        with loader(ds.paths[:4], decode=seen) as probe:
            out["workers_after_late"] = sorted({int(v) for b in probe for v in b})
    out["script"] = int(ImageFile.LOAD_TRUNCATED_IMAGES)
    with loader(ds, decode=aioloader.ImageDecoder(32), on_error="skip") as ld:
        delivered = 0
        for epoch in range(2):  # the second long after the workers were up: theirs alone
            ld.set_epoch(epoch)
            delivered += sum(len(labels) for _, labels in ld)
        out["delivered"] = delivered
        out["failures"] = ld.stats.failures_by_reason
        out["failed"] = sorted(set(ld.stats.last_failed_paths))
    with loader(ds, decode=aioloader.ImageDecoder(32)) as ld:
        try:
            list(ld)
        except aioloader.DecodeError as err:
            out["raised"] = [err.path, str(err).splitlines()[0]]
    print(json.dumps(out))
"""


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.parametrize("setting", ["unset", "set", "late"])
def test_never_a_partial_image_whatever_the_script_sets_in_pillow(
    tmp_path: Path, setting: str, runtime: str
) -> None:
    """A training script that sets ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True`` (Pillow then
    fills what a damaged file lacks with grey) still gets no partial image from ImageDecoder:
    a JPEG cut short, a JPEG with a marker inside its scan and a PNG cut short are skipped
    and counted in both epochs, or the first raises a DecodeError naming it.

    Where the global reaches (the probe ``seen``): set at the script's top, every process
    that decodes has it, the zygote and so the workers and the loader process included; set
    once a loader has started ("late"), only the script's own process does (hot start's
    thread in the trainer), since the zygote, which forks the workers and the loader
    process, copied the process before. The script keeps one OS thread (one OpenBLAS
    thread) so that its zygote is such a copy (tests/test_zygote_threads.py); one started
    clean, as from a multi-threaded trainer, has Pillow's default in every helper."""
    root = make_image_folder(tmp_path / "img", num_images=9, num_classes=3, size=(64, 48))
    damaged = {
        root / "class_00" / "a_cut.jpg": lambda data: data[: len(data) // 2],
        root / "class_01" / "m_marker.jpg": lambda data: overwrite_scan(data, 0.5, MARKER_IN_SCAN),
    }
    source = sorted((root / "class_02").iterdir())[0].read_bytes()
    for path, damage in damaged.items():
        path.write_bytes(damage(source))
    png = root / "class_02" / "z_cut.png"
    buf = io.BytesIO()
    Image.open(io.BytesIO(source)).save(buf, "PNG")
    png.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    bad = sorted(str(p) for p in [*damaged, png])
    script = tmp_path / "train.py"
    proc = start_script(
        script,
        PILLOW_FLAG_SCRIPT,
        [str(script), setting, runtime, str(root)],
        env={"OPENBLAS_NUM_THREADS": "1"},
    )
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["script"] == (setting != "unset")
    assert got["workers"] == [int(setting == "set")]
    if setting == "late":
        assert got["workers_after_late"] == [0]  # the zygote's copy, made before
    assert got["failed"] == bad and got["failures"] == {"DecodeError": 2 * len(bad)}
    assert got["delivered"] == 2 * (9 + 3 - len(bad))
    assert got["raised"][0] == str(root / "class_00" / "a_cut.jpg") and "truncated" in got["raised"][1]
    assert session_survivors(proc.pid) == []


def test_corrupt_files_are_skipped_and_counted(jpegs: FileDataset, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader")
    for i in (2, 7):
        Path(jpegs.path(i)).write_bytes(b"not a jpeg")
    with Loader(
        jpegs, batch_size=4, decode=aioloader.ImageDecoder(16), on_error="skip", num_workers=2
    ) as loader:
        sizes = [len(b[1]) for b in loader]
        stats = loader.stats
    assert sum(sizes) == 10
    assert stats.failures_by_reason == {"DecodeError": 2}
    assert set(stats.last_failed_paths) == {jpegs.path(2), jpegs.path(7)}
    assert sum("skipped" in r.message for r in caplog.records) == 2


def test_zero_byte_file_never_reaches_a_worker(numbered: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with (
        Loader(
            [numbered[0], str(empty)], batch_size=2, decode=Fault("raise", set()), num_workers=1
        ) as loader,
        pytest.raises(ReadError, match="empty file") as info,
    ):
        list(loader)
    assert info.value.path == str(empty) and info.value.__cause__ is None


def test_file_deleted_after_the_dataset_was_built(numbered: list[str], tmp_path: Path) -> None:
    copy = [shutil.copy(p, tmp_path / Path(p).name) for p in numbered[:6]]
    ds = FileDataset(copy)
    os.unlink(copy[4])
    fault = Fault("raise", set())
    with (
        Loader(ds, batch_size=3, shuffle=False, decode=fault, num_workers=1) as loader,
        pytest.raises(ReadError) as info,
    ):
        list(loader)
    assert info.value.path == str(copy[4]) and isinstance(info.value.__cause__, FileNotFoundError)


PERMISSION_SCRIPT = """
import aioloader

if __name__ == "__main__":
    with aioloader.Loader({paths!r}, batch_size=2, shuffle=False, decode=None) as loader:
        try:
            list(loader)
        except aioloader.ReadError as err:
            print("ReadError", type(err.__cause__).__name__, err.path)
    with aioloader.Loader({paths!r}, batch_size=2, shuffle=False, decode=None, on_error="skip") as loader:
        print("ok", sum(len(batch) for batch in loader))
"""
#: Root without the two capabilities that let it read any file: a user for whom a mode-000
#: file is unreadable, who can still run this interpreter and its packages wherever they are
#: (a virtualenv in a private clone, mode 0700, which user nobody could not enter).
NO_READ_OVERRIDE = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_permission_denied_as_a_user_who_may_not_read_the_file(tmp_path: Path) -> None:
    """A file the loader's user may not read is a ReadError caused by PermissionError,
    naming the file; the other file of the batch is not lost. The script runs as root
    without ``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH`` (``setpriv``), so that a mode-000
    file is denied to it and to every helper it starts."""
    ok, secret = tmp_path / "ok.txt", tmp_path / "secret.txt"
    ok.write_bytes(b"sample-000001")
    secret.write_bytes(b"sample-000002")
    secret.chmod(0o000)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(PERMISSION_SCRIPT.format(paths=[str(ok), str(secret)])))
    proc = subprocess.run(
        [*NO_READ_OVERRIDE, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=script_env(),
    )
    if "setpriv:" in proc.stderr:  # a container that may not drop capabilities
        pytest.skip(f"setpriv cannot drop the capabilities here: {proc.stderr.strip()}")
    assert proc.stdout.split() == ["ReadError", "PermissionError", str(secret), "ok", "1"], proc.stderr


def test_transient_read_errors_are_retried_and_counted(numbered: list[str]) -> None:
    flaky = FlakyRead({3, 11, 30}, failures=2, err=errno.EIO)
    with Loader(
        numbered, batch_size=5, decode=Fault("raise", set()), read=flaky, read_retries=2, num_workers=1
    ) as loader:
        assert sorted(run_epoch(loader)) == ALL
        assert loader.stats.read_retries == 6


def per_batch(loader: Loader) -> list[list[int]]:
    return [flatten([batch]) for batch in loader]


def test_a_transient_error_on_every_file_is_retried_and_counted_once_each(numbered: list[str]) -> None:
    """The first read of every one of 32 files fails with EIO (a custom ``read``: fast groups
    on a read thread): each file is read twice, each retry counted once, and the batches are
    those of a loader whose reads never fail, in the same order."""
    files = numbered[:32]

    def loader(read: FlakyRead) -> Loader:
        return Loader(
            files, batch_size=8, decode=Fault("raise", set()), read=read, read_retries=2, num_workers=1
        )

    flaky = FlakyRead(set(range(32)), failures=1, err=errno.EIO)
    with loader(flaky) as flaky_loader:
        got = per_batch(flaky_loader)
        assert flaky_loader.stats.read_retries == 32
    assert flaky.attempts == {p: 2 for p in files}
    with loader(FlakyRead(set())) as clean:
        assert got == per_batch(clean)


def test_a_file_failing_transiently_for_good_is_skipped_alone(numbered: list[str]) -> None:
    """Every read of file 20 (in the middle of its read chunk, files 16-23) fails with EIO:
    it is tried ``read_retries`` more times (each counted), then skipped; the rest of its
    batch is delivered, every other file read once."""
    flaky = FlakyRead({20}, failures=1_000, err=errno.EIO)
    with Loader(
        numbered,
        batch_size=16,
        shuffle=False,
        decode=Fault("raise", set()),
        read=flaky,
        read_retries=2,
        num_workers=1,
        on_error="skip",
    ) as loader:
        got = per_batch(loader)
        assert loader.stats.read_retries == 2
    assert got == [list(range(16)), [n for n in range(16, 32) if n != 20], list(range(32, 37))]
    assert flaky.attempts == {p: 3 if i == 20 else 1 for i, p in enumerate(numbered)}


def test_read_errors_past_the_retries_fail(numbered: list[str]) -> None:
    flaky = FlakyRead({8}, failures=3, err=errno.EAGAIN)
    with Loader(
        numbered, batch_size=5, decode=Fault("raise", set()), read=flaky, read_retries=2, num_workers=1
    ) as loader:
        with pytest.raises(ReadError) as info:
            list(loader)
        assert isinstance(info.value.__cause__, BlockingIOError) and info.value.index == 8


def test_permanent_read_errors_are_not_retried(numbered: list[str]) -> None:
    flaky = FlakyRead({8}, failures=5, err=errno.EACCES)
    fault = Fault("raise", set())
    with (
        Loader(numbered, batch_size=5, decode=fault, read=flaky, num_workers=1) as loader,
        pytest.raises(ReadError),
    ):
        list(loader)
    assert flaky.attempts[numbered[8]] == 1


# -- worker crashes and hangs ---------------------------------------------------------------


@pytest.mark.parametrize("action", ["kill", "exit", "segfault"])
def test_worker_crash_once_is_recovered_without_loss(
    numbered: list[str], tmp_path: Path, action: str
) -> None:
    fault = Fault(action, {13}, once=True, marker_dir=str(tmp_path))
    with Loader(numbered, batch_size=4, decode=fault, num_workers=2) as loader:
        got = run_epoch(loader)
        assert sorted(got) == ALL  # every sample exactly once
        assert loader.stats.worker_restarts == 1
        assert sorted(run_epoch(loader)) == ALL  # and the rebuilt pool keeps working


def test_a_file_that_always_crashes_its_worker_fails_alone(numbered: list[str]) -> None:
    with Loader(numbered, batch_size=4, decode=Fault("kill", {13}), on_error="skip", num_workers=2) as loader:
        got = run_epoch(loader)
        stats = loader.stats
    assert sorted(got) == [i for i in ALL if i != 13]
    assert stats.failures_by_reason == {"DecodeError": 1} and stats.worker_restarts == 2


def test_crashes_past_max_worker_restarts(numbered: list[str]) -> None:
    with (
        Loader(
            numbered,
            batch_size=4,
            shuffle=False,
            decode=Fault("kill", {5, 13, 21}),
            max_worker_restarts=1,
            num_workers=1,
        ) as loader,
        pytest.raises(WorkerCrashedError) as info,
    ):
        list(loader)  # a loader that went on restarting would hang: the global timeout ends it
    message = str(info.value)
    assert "SIGKILL" in message and "pid " in message and "max_worker_restarts=1" in message
    assert "f00005.txt" in message or "f00013.txt" in message


def test_hung_decode_times_out_and_the_rest_continues(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=4, decode=Fault("hang", {9}), sample_timeout=1.0, on_error="skip", num_workers=2
    ) as loader:
        got = run_epoch(loader)
        stats = loader.stats
    assert sorted(got) == [i for i in ALL if i != 9]
    assert stats.failures_by_reason == {"LoaderTimeoutError": 1}
    assert stats.worker_restarts == 0  # a timeout is not a crash


def test_hung_decode_raises_a_timeout_naming_the_file(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=4, shuffle=False, decode=Fault("hang", {9}), sample_timeout=1.0, num_workers=1
    ) as loader:
        with pytest.raises(LoaderTimeoutError) as info:
            list(loader)
        assert info.value.index == 9 and info.value.path == numbered[9]
        assert isinstance(info.value, SampleError)  # a sample's error, like a read or decode error
        assert loader.stats.worker_restarts == 0  # killing the hung worker is not a crash
        loader.set_epoch(1)
        it = iter(loader)
        assert flatten([next(it), next(it)]) == list(range(8))  # still usable


def test_hung_read_times_out(numbered: list[str]) -> None:
    slow = SlowRead({17}, seconds=3.0)
    with Loader(
        numbered,
        batch_size=4,
        decode=Fault("raise", set()),
        read=slow,
        sample_timeout=0.5,
        on_error="skip",
        num_workers=1,
    ) as loader:
        got = run_epoch(loader)
        stats = loader.stats
    assert sorted(got) == [i for i in ALL if i != 17]
    assert stats.failures_by_reason == {"LoaderTimeoutError": 1}


# -- the process around the loader ---------------------------------------------------------

SIGINT_SCRIPT = """
import signal, sys, time
sys.path.insert(0, {tests!r})
from faults import Fault
import aioloader

if __name__ == "__main__":
    # As in a terminal's foreground process. A shell starts background jobs (`cmd &`, nohup,
    # some CI runners) with SIGINT ignored, children inherit that, and Python then installs
    # no handler: the Ctrl-C below would do nothing and the test would wait for nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hang = Fault("hang", set(range(3, 100)), seconds=3600)
    # All 37 reads run at once and finish in any order; decode slots still go to samples
    # 0-2 first (aioloader/slots.py), else 3-6 could take both workers and the first batch
    # would wait for a hang (seen before the slots were ordered, with 60 s hangs: a 67 s run).
    with aioloader.Loader({paths!r}, batch_size=1, shuffle=False, decode=hang, num_workers=2) as loader:
        for batch in loader:
            print("batch", flush=True)
"""


def _run_script(tmp_path: Path, text: str, **fmt: object) -> subprocess.Popen[str]:
    return start_script(tmp_path / "script.py", text.format(tests=os.path.dirname(__file__), **fmt))


def test_ctrl_c_while_iterating(numbered: list[str], tmp_path: Path) -> None:
    proc = _run_script(tmp_path, SIGINT_SCRIPT, paths=numbered)
    try:
        assert proc.stdout is not None
        for _ in range(3):
            assert proc.stdout.readline().strip() == "batch"
        time.sleep(0.3)  # now blocked waiting for a batch that never comes
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
        # The hangs never end: a close that waited for them would run into this hang guard.
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1, err  # the main one: no stray tracebacks from workers
    assert session_survivors(proc.pid) == []
    assert shm_segments(proc.pid) == set()


EXIT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from faults import Fault
import aioloader

if __name__ == "__main__":
    hang = Fault("hang", set(range(2, 100)), seconds=60)
    # Reads in parallel: sample 0 still gets a decode slot before the hangs take the workers.
    loader = aioloader.Loader({paths!r}, batch_size=1, shuffle=False, decode=hang, num_workers=2)
    it = iter(loader)
    next(it)
    print("exiting", flush=True)
"""


def test_exit_with_an_open_loader_and_hung_workers(numbered: list[str], tmp_path: Path) -> None:
    proc = _run_script(tmp_path, EXIT_SCRIPT, paths=numbered)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode == 0 and "exiting" in out, err
    assert "Traceback" not in err, err
    assert session_survivors(proc.pid) == []
    assert shm_segments(proc.pid) == set()


def test_fork_while_a_loader_runs(numbered: list[str]) -> None:
    with Loader(numbered, batch_size=4, decode=Fault("raise", set()), num_workers=1) as loader:
        it = iter(loader)
        next(it)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: any use is a clear error; exiting must not touch the parent's
            os.close(r)
            try:
                next(it)
                msg = "no error"
            except LoaderError as err:
                msg = str(err)
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            child_says = f.read()
        os.waitpid(pid, 0)
        assert "forked child" in child_says
        rest = flatten(list(it))
        assert len(rest) == 37 - 4  # the parent is unaffected


RLIMIT_SCRIPT = """
import resource, sys, logging
sys.path.insert(0, {tests!r})
from faults import Fault
import aioloader

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    resource.setrlimit(resource.RLIMIT_NOFILE, (60, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    fault = Fault("raise", set())
    with aioloader.Loader({paths!r}, batch_size=8, decode=fault, io_concurrency=64, num_workers=2) as loader:
        n = sum(len(b) for b in loader)
    print("samples", n)
"""


def test_low_open_file_limit_adapts(numbered: list[str], tmp_path: Path) -> None:
    proc = _run_script(tmp_path, RLIMIT_SCRIPT, paths=numbered)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "samples 37" in out
    assert "io_concurrency=64 lowered to" in err and "ulimit -n" in err


def test_drop_last_with_skips_keeps_batches_full(numbered: list[str]) -> None:
    """A batch that lost samples is topped up with the next ones; the epoch's leftover rows
    are dropped, as drop_last says."""
    with Loader(
        numbered,
        batch_size=4,
        shuffle=False,
        drop_last=True,
        decode=Fault("raise", {2, 9, 30}),
        on_error="skip",
        num_workers=2,
    ) as loader:
        batches = list(loader)
        state = loader.state_dict()
    assert [len(b) for b in batches] == [4] * 8  # 34 survivors of the 36 planned: 8 full batches
    survivors = [i for i in range(36) if i not in {2, 9, 30}]
    assert flatten(batches) == survivors[:32]
    assert state["batches_done"] == 9  # every plan batch counted as received

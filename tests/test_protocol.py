"""The decode protocol without processes: the tree walker, the learned sample layout, and
the worker's task function writing into a real (file-backed) slab.

``worker._decode`` is monkeypatched rather than installed with ``worker_init``, which would
set SIGINT to ignored in the test process.
"""

from __future__ import annotations

import collections
import mmap
import os
import pickle
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aioloader import sample_rng
from aioloader.base.tree import LEAF, flatten, map_leaves, unflatten
from aioloader.decode import worker as _worker
from aioloader.decode.chunk import Chunk, Shrink
from aioloader.engine.assemble import view_array
from aioloader.memory.layout import (
    LayoutTracker,
    SampleLayout,
    array_spec,
    declared_layout,
    describe,
    plan_slab,
)
from aioloader.memory.results import ArrayRef, Failed, InArea, Pickled, Shrunk, StatusTable, Written
from aioloader.memory.segments import SegmentHandle

Point = collections.namedtuple("Point", "x y")


# -- tree -------------------------------------------------------------------------------------


def test_flatten_round_trip_keeps_every_container_type() -> None:
    value = {"a": [1, (2, 3)], "b": Point(np.zeros(2), "s"), "c": None}
    treedef, leaves = flatten(value)
    assert len(leaves) == 6 and leaves[0] == 1 and leaves[-1] is None
    back = unflatten(treedef, leaves)
    assert back["a"] == [1, (2, 3)] and isinstance(back["a"][1], tuple)
    assert isinstance(back["b"], Point) and back["b"].y == "s"
    assert pickle.loads(pickle.dumps(treedef)) == treedef  # crosses the pipe
    assert flatten(np.zeros(3))[0] == LEAF


def test_same_structure_means_equal_treedefs() -> None:
    assert flatten({"a": 1, "b": [2]})[0] == flatten({"a": 5, "b": [6]})[0]
    assert flatten({"a": 1, "b": [2]})[0] != flatten({"a": 1, "b": [2, 3]})[0]
    assert flatten((1, 2))[0] != flatten([1, 2])[0]
    assert flatten(Point(1, 2))[0] != flatten((1, 2))[0]


def test_unflatten_checks_the_leaf_count() -> None:
    treedef, _ = flatten((1, 2))
    with pytest.raises(ValueError, match="fewer"):
        unflatten(treedef, [1])
    with pytest.raises(ValueError, match="more"):
        unflatten(treedef, [1, 2, 3])


def test_map_leaves_with_a_leaf_predicate() -> None:
    out = map_leaves(
        {"x": [1, 2], "y": 3}, lambda v: v * 10 if isinstance(v, int) else len(v), lambda v: v == [1, 2]
    )
    assert out == {"x": 2, "y": 30}


# -- layout -----------------------------------------------------------------------------------


def test_array_spec_of_numpy_torch_and_plain_leaves() -> None:
    spec = array_spec(np.zeros((2, 3), dtype=np.float32))
    assert spec is not None and spec.shape == (2, 3) and spec.nbytes == 24 and not spec.torch
    t = array_spec(torch.zeros(4, dtype=torch.bfloat16))
    assert t is not None and t.torch and t.dtype == "bfloat16" and t.nbytes == 8
    assert array_spec(np.array(["a"])) is None  # strings travel pickled
    assert array_spec(np.array([object()])) is None
    assert array_spec(3) is None and array_spec("x") is None and array_spec(None) is None


def test_plan_slab_places_aligned_blocks() -> None:
    sample = SampleLayout(*describe({"a": np.zeros(3, np.uint8), "n": 1, "b": np.zeros(5, np.int64)})[::2])
    layout = plan_slab(4, sample, input_size=100, out_size=50)
    assert layout.input == 64  # after the 4 x 16-byte status rows
    assert len(layout.blocks) == 2
    assert all(off % 64 == 0 for off in (layout.input, *layout.blocks, layout.out))
    assert layout.blocks[0] >= layout.input + 100
    assert layout.blocks[1] >= layout.blocks[0] + 4 * 3
    assert layout.out >= layout.blocks[1] + 4 * 40
    assert layout.size == layout.out + 50
    assert plan_slab(4, None, 0, 0).blocks == ()


def test_tracker_learns_a_fixed_layout_from_the_first_batch() -> None:
    tracker = LayoutTracker()
    assert not tracker.known and tracker.out_bytes_per_sample() == 0
    same = [describe(np.zeros((2, 2), np.uint8))[::2] for _ in range(4)]
    tracker.observe(same, fitted=0, slab_sample=None)
    assert tracker.sample == SampleLayout(*same[0]) and not tracker.varying
    # A slab made before the layout was known: its misses do not count against it.
    tracker.observe(same, fitted=0, slab_sample=None)
    assert tracker.sample is not None
    # A few misses on a slab with the layout are fine; more than a quarter turn it varying.
    odd = [describe(np.zeros((3, 2), np.uint8))[::2]]
    tracker.observe(odd, fitted=7, slab_sample=tracker.sample)
    assert tracker.sample is not None
    tracker.observe(odd * 2, fitted=6, slab_sample=tracker.sample)
    assert tracker.sample is not None  # exactly a quarter
    tracker.observe(odd * 3, fitted=5, slab_sample=tracker.sample)
    assert tracker.sample is None and tracker.varying
    assert tracker.out_bytes_per_sample() >= 64


def test_tracker_goes_varying_when_the_first_batch_disagrees() -> None:
    tracker = LayoutTracker()
    shapes = [describe(np.zeros(n, np.float32))[::2] for n in (1, 2, 3)]
    tracker.observe(shapes, fitted=0, slab_sample=None)
    assert tracker.varying and tracker.sample is None
    assert tracker.out_bytes_per_sample() >= 12


def test_tracker_judges_pickled_batches_against_a_layout_learned_since() -> None:
    """Batches begun before any layout was known come back pickled. When a last batch of
    one sample finishes first and teaches a fixed layout, the full batches that follow it
    must still be able to show the shapes vary (or a whole epoch of slabs gets rows blocks
    that most samples miss, and no output area)."""
    tracker = LayoutTracker()
    ragged = [describe(np.zeros((n % 4 + 1, 2), np.int16))[::2] for n in range(6)]
    tracker.observe(ragged[:1], fitted=0, slab_sample=None)
    assert tracker.sample == SampleLayout(*ragged[0])
    # Two of six match: the rest miss it by far more than a quarter.
    tracker.observe(ragged, fitted=0, slab_sample=None)
    assert tracker.varying and tracker.sample is None
    # Mostly matching pickled samples keep it.
    steady = LayoutTracker()
    same = describe(np.zeros((2, 2), np.int16))[::2]
    steady.observe([same], fitted=0, slab_sample=None)
    steady.observe([same] * 5 + ragged[:1], fitted=0, slab_sample=None)
    assert steady.sample == SampleLayout(*same) and not steady.varying


def test_tracker_ignores_samples_without_arrays() -> None:
    tracker = LayoutTracker()
    tracker.observe([describe(b"raw")[::2], describe(3)[::2]], fitted=0, slab_sample=None)
    assert not tracker.known


def test_declared_layout() -> None:
    layout = SampleLayout.declared((3, 4, 4))
    assert layout.treedef == LEAF and layout.sample_bytes == 48

    class Declares:
        output_shape = (3, 4, 4)
        output_dtype = "float32"

    assert declared_layout(Declares()) == SampleLayout.declared((3, 4, 4), "float32")
    assert declared_layout(lambda data: data) is None  # nothing declared: learned


# -- the worker's task function ----------------------------------------------------------------


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class TwoArgError(Exception):
    """Pickles, but cannot be unpickled: __init__ needs two arguments, args holds one."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


def raise_value_error_in_decode(data: bytes) -> None:
    raise ValueError(f"cannot decode {data!r}")


def raise_unpicklable_in_decode(data: bytes) -> None:
    raise Unpicklable("holds a lock")


def raise_two_arg_error_in_decode(data: bytes) -> None:
    raise TwoArgError(7, "nope")


def run_bytes(items: list[tuple[int, int, Any]], seed: int = 0, epoch: int = 0) -> list[Any]:
    """``(row, index, bytes)`` items through the worker's task function, without a slab."""
    return _worker.run_chunk(Chunk(None, None, items, seed, epoch))


def run_one(data: bytes, seed: int = 0, epoch: int = 0, index: int = 0) -> Any:
    results = run_bytes([(0, index, data)], seed, epoch)
    assert len(results) == 1
    return results[0]


def test_run_chunk_success(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "_decode", lambda data: data.upper())
    assert run_one(b"abc") == Pickled(b"ABC")


def test_run_chunk_failure_returns_exception_and_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "_decode", raise_value_error_in_decode)
    result = run_one(b"xyz")
    assert isinstance(result, Failed)
    assert type(result.error) is ValueError
    assert str(result.error) == "cannot decode b'xyz'"
    assert "raise_value_error_in_decode" in result.traceback
    assert "ValueError: cannot decode b'xyz'" in result.traceback
    # What goes back must cross the process pipe.
    back = pickle.loads(pickle.dumps(result))
    assert type(back.error) is ValueError and str(back.error) == str(result.error)


def test_run_chunk_one_failure_does_not_spoil_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise_value_error_in_decode(data)
        return data * 2

    monkeypatch.setattr(_worker, "_decode", decode)
    results = run_bytes([(0, 10, b"a"), (1, 11, b"bad"), (2, 12, b"c")])
    assert results[0] == Pickled(b"aa")
    assert isinstance(results[1], Failed) and type(results[1].error) is ValueError
    assert results[2] == Pickled(b"cc")


def test_run_chunk_unpicklable_exception_becomes_runtime_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "_decode", raise_unpicklable_in_decode)
    result = run_one(b"")
    assert isinstance(result, Failed) and type(result.error) is RuntimeError
    assert "Unpicklable" in str(result.error) and "holds a lock" in str(result.error)
    assert "raise_unpicklable_in_decode" in result.traceback
    pickle.loads(pickle.dumps(result))


def test_run_chunk_exception_that_cannot_be_unpickled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "_decode", raise_two_arg_error_in_decode)
    back = pickle.loads(pickle.dumps(run_one(b"")))  # the parent's side of the pipe
    assert isinstance(back, Failed)
    assert "TwoArgError" in f"{type(back.error).__name__}: {back.error}"
    assert "7: nope" in str(back.error)


def test_run_chunk_without_worker_init_fails_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "_decode", None)
    result = run_one(b"")
    assert isinstance(result, Failed) and isinstance(result.error, AssertionError)


def test_sample_rng_inside_run_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    def draws(data: bytes) -> tuple[float, float, bool]:
        rng = sample_rng()
        return rng.random(), sample_rng().random(), sample_rng() is rng

    monkeypatch.setattr(_worker, "_decode", draws)
    a1, a2, same = run_one(b"", 1, 2, 3).value
    b1, b2, _ = run_one(b"", 1, 2, 3).value
    c1, _, _ = run_one(b"", 1, 2, 4).value
    assert same  # one generator per sample: successive draws continue its stream
    assert (a1, a2) == (b1, b2)
    assert a1 != a2
    assert c1 != a1
    # Each sample of a chunk gets its own (seed, epoch, index) generator.
    chunk = run_bytes([(0, 4, b""), (1, 3, b"")], 1, 2)
    assert chunk[1].value[:2] == (a1, a2)
    assert chunk[0].value[0] == c1
    # The context is cleared after each sample, success or failure.
    assert getattr(_worker._local, "context", None) is None and getattr(_worker._local, "rng", None) is None
    monkeypatch.setattr(_worker, "_decode", raise_value_error_in_decode)
    run_one(b"", 1, 2, 3)
    assert getattr(_worker._local, "context", None) is None and getattr(_worker._local, "rng", None) is None


def reverse_and_meta(data: bytes) -> Any:
    """A nested sample: a uint8 array (the bytes reversed), a float32 tensor, plain leaves."""
    arr = np.frombuffer(data, dtype=np.uint8)[::-1].copy()
    return {"bytes": arr, "meta": (len(data), "name"), "t": torch.arange(len(data), dtype=torch.float32)}


@pytest.fixture
def slab_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A file-backed slab of 4 rows for 3-byte samples: (handle, layout, mmap of it)."""
    monkeypatch.setattr(_worker, "_maps", OrderedDict())
    sample = SampleLayout(*describe(reverse_and_meta(b"abc"))[::2])
    layout = plan_slab(4, sample, input_size=64, out_size=256)
    path = tmp_path / "slab"
    path.write_bytes(bytes(layout.size))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    m[layout.input : layout.input + 9] = b"abcdefghi"  # three 3-byte files at offsets 0, 3, 6
    st = path.stat()
    yield SegmentHandle("aioloader-test-slab", os.fspath(path), st.st_dev, st.st_ino), layout, m
    for mapped in _worker._maps.values():
        mapped.close()
    m.close()


def test_run_chunk_writes_rows_area_and_pickles_by_fit(
    monkeypatch: pytest.MonkeyPatch, slab_file: Any
) -> None:
    path, layout, m = slab_file
    monkeypatch.setattr(_worker, "_decode", reverse_and_meta)
    items: list[tuple[int, int, Any]] = [(0, 5, (0, 3)), (2, 6, (6, 3)), (1, 7, b"wxyz"), (3, 8, b"pqr")]
    # The slab is its own input arena here (the loader gives a batch an arena of its own).
    chunk = Chunk(path, layout, items, 0, 0, out=(layout.out, 256), inputs=path, inputs_at=layout.input)
    results = _worker.run_chunk(chunk)
    # Samples of the slab's layout went into their rows; the odd one into the output area.
    assert results[0] == Written((3, "name")) and results[1] == Written((3, "name"))
    assert results[3] == Written((3, "name"))
    odd = results[2]
    assert isinstance(odd, InArea)
    buf = np.frombuffer(m, dtype=np.uint8)
    refs = [x for x in odd.leaves if isinstance(x, ArrayRef)]
    assert [r.spec.torch for r in refs] == [False, True]
    assert view_array(buf, refs[0].offset, refs[0].spec).tolist() == list(b"zyxw")
    assert torch.equal(view_array(buf, refs[1].offset, refs[1].spec), torch.arange(4, dtype=torch.float32))
    rebuilt = unflatten(
        odd.treedef, [view_array(buf, x.offset, x.spec) if isinstance(x, ArrayRef) else x for x in odd.leaves]
    )
    assert rebuilt["meta"] == (4, "name")
    # The rows blocks are the batch: row r of each block holds sample r.
    b_spec, t_spec = layout.sample.leaves[0], layout.sample.leaves[3]  # type: ignore[union-attr]
    assert b_spec is not None and t_spec is not None
    rows = view_array(buf, layout.blocks[0], b_spec, 4)
    assert bytes(rows[0]) == b"cba" and bytes(rows[2]) == b"ihg" and bytes(rows[3]) == b"rqp"
    assert bytes(rows[1]) == bytes(3)  # row 1 untouched: its sample went to the output area
    tensors = view_array(buf, layout.blocks[1], t_spec, 4)
    assert torch.equal(tensors[0], torch.arange(3, dtype=torch.float32))
    assert m[layout.input : layout.input + 9] == b"abcdefghi"  # the input is left alone
    # Every row's status names this process as its (finished) decoder.
    status = StatusTable(m, 4)
    assert [status.last(r) for r in range(4)] == [os.getpid()] * 4
    assert [status.busy(r) for r in range(4)] == [(0, 0.0)] * 4
    del buf, rows, tensors, status


def test_run_chunk_pickles_what_does_not_fit_anywhere(
    monkeypatch: pytest.MonkeyPatch, slab_file: Any
) -> None:
    path, layout, _ = slab_file
    monkeypatch.setattr(_worker, "_decode", reverse_and_meta)
    # No output-area share: an odd sample goes back pickled; bytes without arrays too.
    results = _worker.run_chunk(Chunk(path, layout, [(1, 7, b"wxyz")], 0, 0, out=None))
    assert isinstance(results[0], Pickled) and results[0].value["bytes"].tolist() == list(b"zyxw")
    monkeypatch.setattr(_worker, "_decode", lambda data: data.upper())
    chunk = Chunk(path, layout, [(0, 1, (0, 3))], 0, 0, inputs=path, inputs_at=layout.input)
    assert _worker.run_chunk(chunk) == [Pickled(b"ABC")]


def test_what_crosses_to_a_worker_and_back_keeps_every_field_pickled() -> None:
    """Tasks and answers pickle through a constructor call of their own (``__reduce__``,
    faster than a slotted dataclass's state): each field, none left at its default, comes
    back equal. A field added to a class and not to its ``__reduce__`` fails here."""
    import dataclasses

    from aioloader.memory.layout import ArraySpec, SlabLayout

    spec = ArraySpec(shape=(3, 4), dtype="|u1", torch=True, nbytes=12)
    sample = SampleLayout(treedef="*", leaves=(spec, None))
    layout = SlabLayout(64, 1024, 7, sample, (1024, 2048), 4096, 9, 8192)
    handle = SegmentHandle("aioloader-1-2-ab", "/proc/1/fd/3", 5, 6)
    values = [
        spec,
        sample,
        layout,
        handle,
        Chunk(
            handle,
            layout,
            [(1, 2, (3, 4)), (5, 6, b"x")],
            7,
            8,
            (9, 10),
            handle,
            11,
            ("a", "b"),
            Shrink(512, 90, frozenset({1})),
        ),
        Written(("label", 3)),
        Shrunk(Written((1,)), b"small"),
        ArrayRef(16, spec),
        InArea("*", (ArrayRef(0, spec),)),
        Pickled({"k": 1}),
    ]
    for value in values:
        again = pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        assert again == value and type(again) is type(value)  # every field compared
    chunk = values[4]
    assert isinstance(chunk, Chunk)
    for f in dataclasses.fields(chunk):  # the Chunk above sets every field away from its default
        assert f.default is dataclasses.MISSING or getattr(chunk, f.name) != f.default, f.name


def test_a_list_of_leaves_flattens_like_any_list() -> None:
    """A batch of file bytes takes the short way (no call per item): the same structure and
    leaves as a list whose items are descended one by one, and back again."""
    files = [b"a", b"bc", b""]
    treedef, leaves = flatten(files)
    assert treedef == ("list", None, (LEAF, LEAF, LEAF)) and leaves == files
    assert unflatten(treedef, leaves) == files
    mixed = [b"a", {"k": b"b"}, (1, 2.0)]
    treedef, leaves = flatten(mixed)
    assert leaves == [b"a", b"b", 1, 2.0] and unflatten(treedef, leaves) == mixed

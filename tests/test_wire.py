"""How a batch crosses from the loader process (aioloader/run/wire.py), without processes: a real
shared mapping stands in for a slab, and each leaf must come back as the same values, in the
same kind of array, viewing that memory (or pickled where it cannot)."""

from __future__ import annotations

import gc
import mmap
import pickle
from typing import Any

import numpy as np
import pytest
import torch

from aioloader.errors import ReadError
from aioloader.memory.segments import SegmentHandle
from aioloader.run.wire import Located, SlabRef, decode, encode, pack_error, spill, unpack_error

SLAB = SegmentHandle("aioloader-1-0-abcd", "/proc/1/fd/7", 1, 2)


def address(m: mmap.mmap) -> int:
    return int(np.frombuffer(m, dtype=np.uint8).ctypes.data)


def roundtrip(value: Any, m: mmap.mmap, released: list[int]) -> tuple[Any, list[Any]]:
    treedef, leaves, handles = encode(value, [Located(SLAB, address(m), len(m))])
    # What the pipe does to the description.
    treedef, leaves, handles = pickle.loads(pickle.dumps((treedef, leaves, handles)))
    assert handles in ([], [SLAB])
    return decode(treedef, leaves, [m] * len(handles), released.append), leaves


def inside(x: Any, m: mmap.mmap) -> bool:
    ptr = x.data_ptr() if isinstance(x, torch.Tensor) else x.ctypes.data
    return address(m) <= ptr < address(m) + len(m)


def test_slab_views_cross_as_references_and_come_back_as_views() -> None:
    m = mmap.mmap(-1, 1 << 16)
    base = np.frombuffer(m, dtype=np.uint8)
    rows = torch.from_numpy(base[64 : 64 + 4 * 6]).view(torch.int16).reshape(4, 3)  # a rows block
    rows.copy_(torch.arange(12, dtype=torch.int16).reshape(4, 3))
    arr = base[1024 : 1024 + 40].view(np.float32).reshape(2, 5)
    arr[:] = np.arange(10, dtype=np.float32).reshape(2, 5)
    bf = torch.from_numpy(base[2048 : 2048 + 16]).view(torch.bfloat16)
    bf.copy_(torch.tensor([1.5] * 8, dtype=torch.bfloat16))
    labels = torch.tensor([7, 8, 9, 10])  # ordinary memory: pickled
    value = {"x": rows, "view": arr[:, ::2], "bf": bf, "meta": (labels, "name", None)}
    released: list[int] = []
    back, leaves = roundtrip(value, m, released)
    assert sum(isinstance(x, SlabRef) for x in leaves) == 3
    assert torch.equal(back["x"], rows) and back["x"].dtype == torch.int16 and inside(back["x"], m)
    assert isinstance(back["view"], np.ndarray) and np.array_equal(back["view"], arr[:, ::2])
    assert back["view"].strides == arr[:, ::2].strides and inside(back["view"], m)
    assert back["bf"].dtype == torch.bfloat16 and torch.equal(back["bf"], bf)
    assert torch.equal(back["meta"][0], labels) and not inside(back["meta"][0], m)
    assert back["meta"][1:] == ("name", None) and isinstance(back["meta"], tuple)
    # They view the same memory: a write through the slab shows in the received batch.
    rows[0, 0] = 99
    assert int(back["x"][0, 0]) == 99
    # The slab is reported once, when its last view is garbage.
    x = back["x"]
    del back, value
    gc.collect()
    assert released == []
    del x
    gc.collect()
    assert released == [0]


def test_a_numpy_view_alone_keeps_its_slab() -> None:
    """A NumPy leaf (a custom collate's view of the output area, say) is all the trainer
    keeps: the slab is reported free only once that view is garbage, never before (a slab
    reported free is reused by a later batch, which would overwrite the view)."""
    m = mmap.mmap(-1, 1 << 16)
    base = np.frombuffer(m, dtype=np.uint8)
    arr = base[512 : 512 + 24].view(np.int16).reshape(4, 3)
    arr[:] = np.arange(12, dtype=np.int16).reshape(4, 3)
    released: list[int] = []
    back, _ = roundtrip([arr, arr[1:, ::2]], m, released)
    view, strided = back
    del back
    gc.collect()
    assert released == []
    assert np.array_equal(view, arr) and inside(view, m) and view.flags.writeable
    assert np.array_equal(strided, arr[1:, ::2]) and strided.strides == arr[1:, ::2].strides
    del view
    gc.collect()
    assert released == []  # the strided one still views it
    del strided
    gc.collect()
    assert released == [0]


@pytest.mark.parametrize(
    "leaf",
    [
        np.arange(6, dtype=np.int64),  # ordinary memory
        np.zeros(0, dtype=np.uint8),  # empty
        np.array(["a", None], dtype=object),  # objects
    ],
)
def test_what_is_not_a_slab_view_is_pickled(leaf: np.ndarray) -> None:
    m = mmap.mmap(-1, 4096)
    released: list[int] = []
    back, leaves = roundtrip([leaf], m, released)
    assert not any(isinstance(x, SlabRef) for x in leaves)
    assert isinstance(back, list) and back[0].dtype == leaf.dtype and back[0].tolist() == leaf.tolist()


def test_negative_strides_and_overhanging_views_are_pickled() -> None:
    m = mmap.mmap(-1, 4096)
    base = np.frombuffer(m, dtype=np.uint8)
    flipped = base[:16][::-1]
    tail = np.lib.stride_tricks.as_strided(base[4000:], shape=(200,), strides=(1,), writeable=False)
    _, leaves, handles = encode([flipped, tail], [Located(SLAB, address(m), 4096)])
    assert handles == [] and leaves[0] is flipped and leaves[1] is tail


def test_errors_keep_their_path_cause_and_where_they_happened() -> None:
    try:
        try:
            with open("/nonexistent/f.jpg", "rb"):
                pass
        except OSError as cause:
            raise ReadError("cannot read file", path="/nonexistent/f.jpg", index=3) from cause
    except ReadError as exc:
        chain = pickle.loads(pickle.dumps(pack_error(exc)))
    err = unpack_error(chain)
    assert isinstance(err, ReadError) and err.path == "/nonexistent/f.jpg" and err.index == 3
    assert isinstance(err.__cause__, FileNotFoundError)
    assert any("in the loader process" in n and "test_wire.py" in n for n in err.__notes__)


class Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("no")


def test_an_unpicklable_error_still_arrives_as_its_text() -> None:
    err = unpack_error(pickle.loads(pickle.dumps(pack_error(Unpicklable("bad thing")))))
    assert "Unpicklable: bad thing" in str(err)


class _Made:
    """What :func:`spill` needs of a segment: a mapping and a handle."""

    def __init__(self, nbytes: int, n: int) -> None:
        self.mmap = mmap.mmap(-1, nbytes)
        self.handle = SegmentHandle(f"aioloader-1-s{n}-abcd", f"/proc/1/fd/{10 + n}", 1, 3 + n)


def test_large_leaves_of_ordinary_memory_are_spilled_into_segments() -> None:
    """What a custom collate built crosses through a one-shot segment (one copy, mapped by
    the trainer), not the pipe; small leaves and slab views are left alone."""
    big_t = torch.arange(6 * 256 * 256, dtype=torch.int32).reshape(6, 256, 256).transpose(1, 2)  # 1.5 MiB
    big_a = np.arange(1 << 18, dtype=np.float64).reshape(512, 512)  # 2 MiB
    small = torch.arange(10)
    m = mmap.mmap(-1, 1 << 16)
    in_slab = np.frombuffer(m, dtype=np.uint8)[:100]
    value = {"t": big_t, "a": big_a, "small": small, "slab": in_slab}
    treedef, leaves, handles = encode(value, [Located(SLAB, address(m), len(m))])
    made: list[_Made] = []
    segments = spill(leaves, handles, lambda n: made.append(_Made(n, len(made))) or made[-1])
    assert segments == made and len(made) == 2
    assert [h.name for h in handles] == [SLAB.name, *(s.handle.name for s in made)]
    assert [type(x).__name__ for x in leaves] == ["SlabRef", "SlabRef", "Tensor", "SlabRef"]
    treedef, leaves, handles = pickle.loads(pickle.dumps((treedef, leaves, handles)))
    released: list[int] = []
    back = decode(treedef, leaves, [m, *(s.mmap for s in made)], released.append)
    assert torch.equal(back["t"], big_t) and back["t"].is_contiguous() and inside(back["t"], made[0].mmap)
    assert np.array_equal(back["a"], big_a) and inside(back["a"], made[1].mmap)
    assert torch.equal(back["small"], small) and np.array_equal(back["slab"], in_slab)
    big_t.zero_()  # a copy: what the loader process does next does not show in the trainer
    assert back["t"].sum() > 0
    del back
    gc.collect()
    assert sorted(released) == [0, 1, 2]

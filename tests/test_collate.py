"""aioloader.collate.default_collate: a list of samples to one batch of torch tensors."""

from __future__ import annotations

from collections import namedtuple
from fractions import Fraction

import numpy as np
import pytest
import torch

from aioloader import default_collate

Pair = namedtuple("Pair", ["image", "meta"])


def test_tensors_are_stacked() -> None:
    samples = [torch.full((2, 3), float(i)) for i in range(4)]
    batch = default_collate(samples)
    assert isinstance(batch, torch.Tensor)
    assert batch.shape == (4, 2, 3)
    assert batch.dtype == torch.float32
    for i in range(4):
        assert torch.equal(batch[i], samples[i])


def test_zero_dim_tensors() -> None:
    batch = default_collate([torch.tensor(1), torch.tensor(5)])
    assert batch.shape == (2,)
    assert batch.tolist() == [1, 5]


NUMPY_TO_TORCH = {
    np.uint8: torch.uint8,
    np.int16: torch.int16,
    np.int64: torch.int64,
    np.float16: torch.float16,
    np.float32: torch.float32,
    np.float64: torch.float64,
    np.bool_: torch.bool,
}


def test_numpy_arrays_become_a_tensor() -> None:
    for np_dtype, torch_dtype in NUMPY_TO_TORCH.items():
        samples = [(np.arange(6).reshape(3, 2) + i).astype(np_dtype) for i in range(5)]
        batch = default_collate(samples)
        assert isinstance(batch, torch.Tensor)
        assert batch.shape == (5, 3, 2)
        assert batch.dtype == torch_dtype, np_dtype
        assert np.array_equal(batch.numpy(), np.stack(samples))


def test_image_like_arrays_uint8_chw() -> None:
    samples = [np.full((3, 8, 8), i, dtype=np.uint8) for i in range(3)]
    batch = default_collate(samples)
    assert batch.dtype == torch.uint8
    assert batch.shape == (3, 3, 8, 8)
    assert batch[2].unique().tolist() == [2]


def test_numpy_batch_does_not_alias_samples() -> None:
    samples = [np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32)]
    batch = default_collate(samples)
    samples[0][:] = 7
    assert batch[0].tolist() == [0, 0, 0]


def test_numpy_arrays_of_strings_or_objects_raise() -> None:
    for dtype in (np.str_, np.bytes_, np.object_):
        with pytest.raises(TypeError, match="dtype"):
            default_collate([np.array(["a", "b"], dtype=dtype)] * 2)


def test_python_scalars() -> None:
    b = default_collate([True, False, True])
    assert b.dtype == torch.bool
    assert b.tolist() == [True, False, True]
    i = default_collate([1, 2, 3])
    assert i.dtype == torch.int64
    assert i.tolist() == [1, 2, 3]
    f = default_collate([0.5, 1.5])
    assert f.dtype == torch.float64
    assert f.tolist() == [0.5, 1.5]
    big = default_collate([2**40, -(2**40)])
    assert big.tolist() == [2**40, -(2**40)]


NUMPY_SCALARS = [
    ([np.float32(1.5), np.float32(2.5)], torch.float32),
    ([np.int32(1), np.int32(2)], torch.int32),
    ([np.int64(7), np.int64(8)], torch.int64),
    ([np.uint8(7), np.uint8(8)], torch.uint8),
    ([np.bool_(True), np.bool_(False)], torch.bool),
    ([np.float64(0.25), np.float64(0.75)], torch.float64),
]


def test_numpy_scalars_keep_their_dtype() -> None:
    for values, dtype in NUMPY_SCALARS:
        batch = default_collate(values)
        assert isinstance(batch, torch.Tensor)
        assert batch.dtype == dtype, values
        assert batch.shape == (2,)
        assert batch.tolist() == [v.item() for v in values]  # type: ignore[attr-defined]


def test_other_numbers_registered_with_numbers_abc() -> None:
    batch = default_collate([Fraction(1, 2), Fraction(3, 4)])
    assert batch.dtype == torch.float64
    assert batch.tolist() == [0.5, 0.75]


def test_mixed_numbers_get_a_dtype_that_fits_every_sample() -> None:
    mixed = default_collate([1, 2.5])
    assert mixed.dtype == torch.float64
    assert mixed.tolist() == [1.0, 2.5]  # never an int64 that truncates 2.5
    ints = default_collate([1, np.int64(2), True])
    assert ints.dtype == torch.int64
    assert ints.tolist() == [1, 2, 1]
    reals = default_collate([np.float32(0.5), 2])
    assert reals.dtype == torch.float64
    assert reals.tolist() == [0.5, 2.0]


def test_numbers_mixed_with_complex_raise() -> None:
    with pytest.raises(TypeError, match="complex"):
        default_collate([1, 2j])


def test_str_bytes_none_stay_a_list() -> None:
    for values in (["a", "b", "c"], [b"x", b"yy"], [None, None], ["a", None], [None, "a"]):
        batch = default_collate(values)
        assert type(batch) is list
        assert batch == values
        assert batch is not values


def test_tuple_of_image_and_label() -> None:
    samples = [(np.full((3, 4, 4), i, dtype=np.uint8), i) for i in range(6)]
    images, labels = default_collate(samples)
    assert images.shape == (6, 3, 4, 4)
    assert images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert labels.tolist() == list(range(6))
    assert type(default_collate(samples)) is tuple


def test_list_samples_give_a_list() -> None:
    batch = default_collate([[1, "a"], [2, "b"]])
    assert type(batch) is list
    assert batch[0].tolist() == [1, 2]
    assert batch[1] == ["a", "b"]


def test_dict_samples_collated_per_key() -> None:
    samples = [{"x": np.array([i, i], dtype=np.float32), "name": f"s{i}", "y": i} for i in range(3)]
    batch = default_collate(samples)
    assert set(batch) == {"x", "name", "y"}
    assert batch["x"].shape == (3, 2)
    assert batch["x"].dtype == torch.float32
    assert batch["name"] == ["s0", "s1", "s2"]
    assert batch["y"].tolist() == [0, 1, 2]


def test_namedtuple_kept() -> None:
    samples = [Pair(torch.zeros(2), {"id": i, "tag": None}) for i in range(3)]
    batch = default_collate(samples)
    assert type(batch) is Pair
    assert batch.image.shape == (3, 2)
    assert batch.meta["id"].tolist() == [0, 1, 2]
    assert batch.meta["tag"] == [None, None, None]


def test_deeply_nested() -> None:
    samples = [{"a": [(torch.tensor([i]), {"b": float(i)})]} for i in range(2)]
    batch = default_collate(samples)
    inner = batch["a"]
    assert type(inner) is list and len(inner) == 1
    t, d = inner[0]
    assert t.tolist() == [[0], [1]]
    assert d["b"].dtype == torch.float64
    assert d["b"].tolist() == [0.0, 1.0]


def test_sequences_of_different_lengths_raise() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        default_collate([(1, 2), (1, 2, 3)])


def test_mismatched_shapes_raise_with_the_shapes() -> None:
    a, b = np.zeros((3, 4, 4), dtype=np.uint8), np.zeros((3, 5, 4), dtype=np.uint8)
    for samples in ([torch.from_numpy(a), torch.from_numpy(b)], [a, b], [a, a, b]):
        with pytest.raises(ValueError, match="shapes") as info:
            default_collate(samples)
        message = str(info.value)
        assert "(3, 4, 4)" in message
        assert "(3, 5, 4)" in message


def test_mismatched_shapes_in_a_nested_sample() -> None:
    samples = [(np.zeros(2), 0), (np.zeros(3), 1)]
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        default_collate(samples)


class Opaque:
    pass


def test_unsupported_type_raises_naming_it() -> None:
    for values, name in (
        ([Opaque(), Opaque()], "Opaque"),
        ([{1, 2}], "set"),
        ([object()], "object"),
        ([1j], "complex"),
    ):
        with pytest.raises(TypeError, match=rf"\b{name}\b"):
            default_collate(values)


def test_empty_list_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        default_collate([])

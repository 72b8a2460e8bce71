"""Settings per part: each of ``Loader``'s arguments is written in three places (its
parameter, with the part's default; its entry in the docstring; its part's field, default
and check), and the loader hands each part its own object, never the arguments one by one.
Pure: no loader is started."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import aioloader
from aioloader import Cache, ImageDecoder, Loader
from aioloader.config import PARTS, Build, LoaderConfig
from aioloader.decode.settings import Decoding
from aioloader.engine.settings import Delivery, Failures
from aioloader.plan.settings import Sampling
from aioloader.read.settings import Reading

PKG = Path(aioloader.__file__).resolve().parent
ARGS = [name for name in inspect.signature(Loader).parameters if name not in ("self", "dataset")]
OWNER = {f.name: part for part in PARTS for f in dataclasses.fields(part)}


def test_each_argument_belongs_to_exactly_one_part() -> None:
    fields = [f.name for part in PARTS for f in dataclasses.fields(part)]
    assert len(fields) == len(set(fields)), "an argument in two parts"
    assert set(ARGS) == set(fields) | {"cache"}, "Loader's arguments are the parts' fields and cache"


def test_the_signature_reads_each_default_from_its_part() -> None:
    """The default a user sees (``help(Loader)``, the API page) is the part's, not a copy."""
    params = inspect.signature(Loader).parameters
    for name in ARGS:
        field = next(f for f in dataclasses.fields(OWNER.get(name, LoaderConfig)) if f.name == name)
        assert params[name].default is field.default, name
    source = inspect.getsource(Loader.__init__)
    for name in ARGS:
        (line,) = [x for x in source.splitlines() if re.match(rf"\s+{name}: ", x)]
        part = OWNER[name].__name__ if name in OWNER else "LoaderConfig"
        assert line.rstrip().endswith(f"= {part}.{name},"), line


def test_the_docstring_documents_each_argument_once() -> None:
    doc = inspect.getdoc(Loader) or ""
    args = doc.split("Args:", 1)[1]
    for name in ARGS:
        assert len(re.findall(rf"^    {name}: ", args, flags=re.M)) == 1, name


def test_no_function_takes_the_arguments_one_by_one() -> None:
    """The six copies this replaced (signature, docstring, the call to the checks, the
    arguments' class, the config's fields, its constructor call): outside ``cli/`` (which
    makes loaders), only ``Loader.__init__`` names more than seven of the arguments, and only
    the parts declare three or more as fields (``observe/`` reports counts under their names)."""
    wide = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ("cli", "observe"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]} & set(ARGS)
                if len(names) > 7:
                    wide.append(f"{rel}:{node.lineno} def {node.name}")
            if isinstance(node, ast.Call):
                names = {k.arg for k in node.keywords if k.arg} & set(ARGS)
                if len(names) > 7:
                    wide.append(f"{rel}:{node.lineno} call")
            if isinstance(node, ast.ClassDef) and node.name not in {p.__name__ for p in PARTS}:
                declared = {
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
                if len(declared & set(ARGS)) >= 3:
                    wide.append(f"{rel}:{node.lineno} class {node.name}")
    assert [(w.split(":")[0], w.split(" ", 1)[1]) for w in wide] == [("loader.py", "def __init__")], wide


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Sampling(batch_size=0), "batch_size=0 must be a positive integer"),
        (lambda: Sampling(rank=2, world_size=2), "rank=2 must be below world_size=2"),
        (
            lambda: Reading(io_concurrency="fast"),
            "io_concurrency='fast' must be a positive integer or 'auto'",
        ),
        (lambda: Reading(read_retries=-1), "read_retries=-1 must be a non-negative integer"),
        (lambda: Decoding(num_workers=0), "num_workers=0 must be a positive integer"),
        (lambda: Decoding(decode=None, decode_on="ray"), "decode_on='ray' needs a decode function"),
        (lambda: Delivery(prefetch=0), "prefetch=0 must be a positive integer"),
        (lambda: Delivery(loader_process="yes"), "loader_process='yes' must be 'auto', True or False"),
        (lambda: Failures(max_failures=3), "max_failures=3 needs on_error='skip'"),
        (lambda: Failures(sample_timeout=0), "sample_timeout=0 must be a positive number of seconds or None"),
    ],
)
def test_a_part_checks_itself_when_made(make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert str(info.value).startswith(message)


def test_parts_settle_what_they_are_given_once() -> None:
    """None and ``"auto"`` are settled where the part is made, and kept: no part is replaced."""
    s = Sampling()
    assert (s.rank, s.world_size, s.shard) == (0, 1, (0, 1))
    d = Delivery(pin_memory=True)
    assert str(d.device) == "cpu" and d.pin_memory is False  # page-locked memory only for CUDA
    assert isinstance(Decoding().decode, ImageDecoder) and Decoding().decode is not Decoding().decode
    r = Reading()
    assert r.io_auto and r.io_start == 64 and Reading(io_concurrency=8).io_start == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 8  # type: ignore[misc]


def decode_twice(data: bytes) -> int:
    return 2 * len(data)


def test_a_config_pickles_with_its_callables_by_value() -> None:
    """What crosses to the loader process: every part whole, the callables as the blobs made
    once when the loader was made, put back in their parts on the other side."""
    config = LoaderConfig.create(
        {"batch_size": 3, "decode": decode_twice, "collate": list, "read": len, "cache": Cache()}
    )
    assert set(config.build.sent) == {"decode", "read", "collate"}
    again = pickle.loads(pickle.dumps(config))
    assert (
        again.decoding.decode(b"abc") == 6
        and again.reading.read("ab") == 2
        and again.delivery.collate is list
    )
    assert (again.sampling, again.failures, again.cache) == (config.sampling, config.failures, config.cache)
    assert isinstance(again.build, Build) and again.build.workers == config.build.workers


def test_unknown_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['batch'\]"):
        LoaderConfig.create({"batch": 3})


def test_a_state_dict_saved_before_the_parts_resumes_the_same_batches() -> None:
    """``tests/data/state_before_parts.json``: a state taken after 3 batches by aioloader
    0defa2a (one flat config), and the batches an uninterrupted run of it delivered after
    them. A loader of the same settings resumes it here with exactly those batches."""
    saved = json.loads((Path(__file__).parent / "data" / "state_before_parts.json").read_text())
    paths = [f"f{i:03d}.bin" for i in range(50)]
    loader = Loader(
        paths,
        batch_size=4,
        decode=None,
        seed=7,
        rank=1,
        world_size=2,
        read=lambda p: p.encode(),
        collate=list,
        loader_process=False,
    )
    with loader:
        loader.load_state_dict(saved["state"])
        assert [[b.decode() for b in batch] for batch in loader] == saved["rest"]

"""The house (``docs/how-it-works/layout.md``): what the folders, the wings' maps and the import contracts
promise, and that the move into wings left old pickles loading.

The contracts themselves are checked by ``lint-imports`` in CI; here they are shown to
*fail* on a copy of the package with one deliberate violation each, so a contract that
stopped checking anything would be noticed.
"""

from __future__ import annotations

import ast
import io
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import aioloader
from aioloader import FileDataset, ImageDecoder, default_collate
from aioloader.config import LoaderConfig

PKG = Path(aioloader.__file__).resolve().parent
ROOT = PKG.parent
WINGS = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
MODULES = sorted(p.relative_to(PKG) for p in PKG.rglob("*.py"))


def test_wings_and_at_most_12_modules_at_the_top() -> None:
    assert WINGS == [
        "base",
        "cache",
        "cli",
        "cluster",
        "decode",
        "engine",
        "memory",
        "observe",
        "plan",
        "procs",
        "read",
        "run",
        "safety",
        "tune",
    ]
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 12, top


def test_no_module_over_400_lines() -> None:
    lines = {str(m): len((PKG / m).read_text().splitlines()) for m in MODULES}
    assert {m: n for m, n in lines.items() if n > 400} == {}


def test_no_function_over_60_lines_outside_cli() -> None:
    """Every function and method of the package, nested ones included, is at most 60 lines
    from its ``def`` to its last line; ``cli/`` (argument parsers, report layouts) is left
    out, nothing else."""
    long = {}
    for module in MODULES:
        if module.parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse((PKG / module).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 60:
                    long[f"{module}:{node.lineno} {node.name}"] = lines
    assert long == {}


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_maps_exactly_its_modules(wing: str) -> None:
    doc = ast.get_docstring(ast.parse((PKG / wing / "__init__.py").read_text())) or ""
    mapped = set(re.findall(r"^\| ``(\w+)\.py``", doc, flags=re.M))
    present = {p.stem for p in (PKG / wing).glob("*.py")} - {"__init__"}
    assert mapped == present, f"aioloader/{wing}/__init__.py maps {sorted(mapped)}, has {sorted(present)}"


def test_the_docs_layout_names_every_module_under_its_wing() -> None:
    """``docs/how-it-works/layout.md`` (the site's "The source tree"): the map names every
    wing, and each wing's table, up to the page's "Examples and benchmarks", every module."""
    page = ROOT / "docs" / "how-it-works" / "layout.md"
    if not page.is_file():
        pytest.skip("not a checkout: no docs/ beside the package")
    layout = page.read_text().split("\n## Examples and benchmarks\n", 1)[0]
    sections = re.split(r"^\*\*", layout, flags=re.M)
    for wing in WINGS:
        (section,) = [s for s in sections if s.startswith(f"`{wing}/`**")]
        rows = "\n".join(line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `"))
        named = set(re.findall(r"`(\w+)\.py`", rows))
        present = {p.stem for p in (PKG / wing).glob("*.py")} - {"__init__"}
        assert named == present, wing
        assert f"\n  {wing}/ " in layout, f"{wing}/ has no line in the map"
    (top,) = [s for s in sections if s.startswith("Top level**")]
    assert set(re.findall(r"`aioloader/(\w+)\.py`", top)) == {p.stem for p in PKG.glob("*.py")}


# -- the import contracts ([tool.importlinter] in pyproject.toml) ----------------------------

#: One deliberate violation per contract: (file, text appended, the contract it breaks).
VIOLATIONS = {
    "errors-imports-cli": (
        "errors.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.cli import main  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    "deferred-decode-imports-run": (
        "decode/pool.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.run import bridge  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    "pure-plan-imports-asyncio": (
        "plan/sampler.py",
        "\n\nimport asyncio  # noqa: E402, F401\n",
        "pure wings: no I/O, no event loop, no processes",
    ),
    "rules-import-the-reader": (
        "tune/rules.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.read import reader  # noqa: F401\n",
        "pure wings: no I/O, no event loop, no processes",
    ),
    "loop-inside-decode": (
        "decode/chunk.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.decode import stage  # noqa: F401\n",
        "no import loop between the modules of a wing, or between wings",
    ),
    # read/ and decode/ are siblings: neither imports the other.
    "read-imports-decode": (
        "read/reader.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.decode import chunk  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    "decode-imports-read": (
        "decode/stage.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.read import outcomes  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    # memory/ is below both stages; procs/ below everything but safety/ and errors.
    "memory-imports-decode": (
        "memory/slabs.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.decode import worker  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    "procs-imports-memory": (
        "procs/zygote.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.memory import segments  # noqa: F401\n",
        "wings import only the wings below them",
    ),
    "pure-layout-maps-memory": (
        "memory/layout.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.memory import segments  # noqa: F401\n",
        "pure wings: no I/O, no event loop, no processes",
    ),
    # The engine holds its decode stage by the contract (decode/contract.py), never its class.
    "engine-knows-the-local-stage": (
        "engine/epoch.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.decode import stage  # noqa: F401\n",
        "the engine and the tuner know a decode stage only by its contract",
    ),
    "tuner-knows-the-ray-stage": (
        "tune/tuner.py",
        "\n\ndef _sneak() -> None:\n    from aioloader.cluster import stage  # noqa: F401\n",
        "the engine and the tuner know a decode stage only by its contract",
    ),
}


def _lint(repo: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.is_file():
        pytest.skip("lint-imports is not installed (pip install -e '.[dev]')")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo), "HOME": str(repo)}
    return subprocess.run(
        [str(exe), "--no-cache"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(PKG, repo / "aioloader", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def test_contracts_are_kept(package_copy: Path) -> None:
    done = _lint(package_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_contracts_catch_a_violation(package_copy: Path, case: str) -> None:
    file, text, contract = VIOLATIONS[case]
    with open(package_copy / "aioloader" / file, "a") as f:
        f.write(text)
    done = _lint(package_copy)
    assert done.returncode == 1, done.stdout + done.stderr
    broken = done.stdout.split("Broken contracts", 1)[1]
    assert f"\n{contract}\n" in broken, broken


# -- the public surface did not move ----------------------------------------------------------


def test_pickles_from_before_the_wings_still_load() -> None:
    """``tests/data/before_wings.pkl`` was written by aioloader 017fc57 (the flat package):
    a ``LoaderConfig`` (its callables carried by value), two ``FileDataset`` s and an
    ``ImageDecoder``."""
    data = pickle.loads((Path(__file__).parent / "data" / "before_wings.pkl").read_bytes())
    config = data["config"]
    assert isinstance(config, LoaderConfig)
    assert (
        config.sampling.batch_size,
        config.sampling.seed,
        config.failures.on_error,
        config.failures.max_failures,
    ) == (4, 3, "skip", 0.5)
    assert set(config.build.sent) == {"decode"}
    assert isinstance(config.decoding.decode, ImageDecoder) and config.delivery.collate is default_collate
    assert (config.delivery.loader_process, config.build.start_in) == (
        False,
        "thread",
    )  # as the names are now

    jpeg = io.BytesIO()
    Image.fromarray(np.full((40, 50, 3), 7, np.uint8)).save(jpeg, format="JPEG")
    samples = [config.decoding.decode(jpeg.getvalue()), data["decoder"](jpeg.getvalue())]
    batch = config.delivery.collate(samples)
    assert isinstance(batch, torch.Tensor) and batch.shape == (2, 3, 32, 32)

    plain, ranged = data["dataset"], data["ranged"]
    assert isinstance(plain, FileDataset) and isinstance(ranged, FileDataset)
    assert list(plain.paths) == ["a/x.jpg", "a/y.jpg", "b/z.jpg"]
    assert plain.labels is not None and plain.labels.tolist() == [0, 0, 1] and plain.classes == ["a", "b"]
    assert [ranged.span(i) for i in range(len(ranged))] == [(0, 10), (10, 20)]
    again = pickle.loads(pickle.dumps(data))  # and they pickle again with today's paths
    assert list(again["dataset"].paths) == list(plain.paths)


def test_documented_import_paths() -> None:
    from aioloader.cli import main
    from aioloader.config import usable_cpus
    from aioloader.synthetic import make_image_folder

    assert callable(main) and callable(make_image_folder) and usable_cpus() >= 1
    done = subprocess.run(
        [sys.executable, "-m", "aioloader", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "bench" in done.stdout and "doctor" in done.stdout


def test_every_test_tests_readme_names_exists() -> None:
    """``tests/README.md`` says which test holds each documented promise: each name it gives
    (``test_x.py::test_y``) is a test of that file."""
    here = Path(__file__).parent
    named = re.findall(r"`(test_\w+\.py)::(\w+)", (here / "README.md").read_text())
    assert len(named) > 100
    missing = []
    for file, name in named:
        tree = ast.parse((here / file).read_text())
        tests = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in tests:
            missing.append(f"{file}::{name}")
    assert missing == []

"""The code examples of README.md and docs/: found, told how to run, and given their folder.

Pure parsing (no I/O beyond reading the pages) for ``test_docs.py``. A page's fenced
```` ```python ```` blocks all run; an HTML comment on the line just before a fence says how:

- ``<!-- run: continue -->``: appended to the page's previous python block, run together
  (as that block runs: a continued ``cuda`` block needs a GPU too);
- ``<!-- run: cuda -->``: needs a CUDA GPU (skipped without one);
- ``<!-- run: s3 -->``: a moto S3 server with the folder under ``s3://my-bucket/train/``;
- ``<!-- run: torchrun -->``: two ranks, ``torch.distributed.run --nproc_per_node 2``;
- ``<!-- run: ray -->``: starts a local Ray cluster (slow);
- ``<!-- run: sh -->``: before a ```` ```bash ```` block, which then runs under ``bash -e``.

Other ``bash``/``console``/``text`` blocks (install commands, output) are shown, not run.
Blocks indented inside tabs or admonitions are found and dedented.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
KINDS = {"plain", "continue", "cuda", "s3", "torchrun", "ray", "sh"}
_FENCE = re.compile(r"^[ \t]*(?P<ticks>`{3,})(?P<lang>[\w-]*)")
_MARK = re.compile(r"^\s*<!--\s*run:\s*(?P<kind>[\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    """One runnable block: ``page`` (relative to the repository), ``line`` (1-based, of its
    opening fence), ``kind`` (one of :data:`KINDS`, ``continue`` resolved into ``code``),
    ``lang`` (``python`` or ``bash``) and ``code`` (the script, dedented)."""

    page: str
    line: int
    kind: str
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def snippets(page: Path) -> list[Snippet]:
    """The runnable blocks of ``page``, in order; a bad marker is a ``ValueError``."""
    lines = page.read_text().splitlines()
    rel = page.relative_to(ROOT).as_posix()
    found: list[Snippet] = []
    last_python: str | None = None
    last_kind = "plain"
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, ticks, lang = i, m["ticks"], m["lang"]
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        code = textwrap.dedent("\n".join(body)) + "\n"
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        mark = _MARK.match(prev)
        kind = mark["kind"] if mark else "plain"
        if kind not in KINDS:
            raise ValueError(f"{rel}:{start + 1}: unknown marker <!-- run: {kind} -->")
        if lang == "python":
            if kind == "sh":
                raise ValueError(f"{rel}:{start + 1}: <!-- run: sh --> marks a bash block")
            if kind == "continue":
                if last_python is None:
                    raise ValueError(f"{rel}:{start + 1}: nothing before it to continue")
                code, kind = last_python + code, last_kind
            found.append(Snippet(rel, start + 1, kind, "python", code))
            last_python, last_kind = code, kind
        elif mark:
            if kind != "sh" or lang not in ("bash", "sh"):
                raise ValueError(f"{rel}:{start + 1}: <!-- run: {kind} --> before a {lang or 'plain'} block")
            found.append(Snippet(rel, start + 1, kind, "bash", code))
    return found


def all_snippets() -> list[Snippet]:
    return [s for p in pages() for s in snippets(p)]


def lay_out_folder(where: Path) -> None:
    """``train/`` (16 JPEGs per class) and ``val/`` (8), classes ``cat`` and ``dog``, 64x48
    px: the folders every example finds in its working directory."""
    from aioloader.synthetic import make_image

    rng = np.random.default_rng(0)
    for split, per_class in (("train", 16), ("val", 8)):
        for cls in ("cat", "dog"):
            folder = where / split / cls
            folder.mkdir(parents=True)
            for k in range(per_class):
                make_image(rng, 64, 48).save(folder / f"{cls}{k:03d}.jpg", quality=90)

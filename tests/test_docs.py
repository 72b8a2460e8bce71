"""The documentation is true to the code: every Python example of README.md and the site runs
(``docsnippets.py`` says how each is told apart), the site builds with ``mkdocs build
--strict``, every public name has an API entry, and the README keeps its promises (short,
the two commands, the extras)."""

from __future__ import annotations

import html
import inspect
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from docsnippets import ROOT, Snippet, all_snippets, lay_out_folder, snippets

import aioloader

SNIPPETS = all_snippets() if (ROOT / "docs").is_dir() else []
pytestmark = pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="not a checkout: no docs/")


def _param(s: Snippet) -> object:
    marks = [pytest.mark.timeout(300)]
    if s.kind == "cuda":
        marks.append(pytest.mark.cuda)
    return pytest.param(s, id=s.id, marks=marks)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-data")
    lay_out_folder(root)
    return root


@pytest.fixture(scope="module")
def bucket(folders: Path) -> Iterator[dict[str, str]]:
    """moto's S3 server holding ``train/`` under ``s3://my-bucket/train/``; yields the
    environment that points AWS clients at it."""
    pytest.importorskip("moto")
    from servers import s3_client, start_moto

    server = start_moto()
    try:
        client = s3_client({"endpoint_url": server.url, "key": "testing", "secret": "testing"})
        client.create_bucket(Bucket="my-bucket")
        for f in sorted((folders / "train").rglob("*.jpg")):
            client.upload_file(str(f), "my-bucket", f.relative_to(folders).as_posix())
        yield {
            "AWS_ENDPOINT_URL": server.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        server.stop()


def _command(s: Snippet, script: Path) -> list[str]:
    """The command that runs ``script``, named by its relative path, as a user types it."""
    if s.lang == "bash":
        return ["bash", "-e", script.name]
    if s.kind == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            script.name,
        ]
    return [sys.executable, script.name]


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_the_example_runs(
    snippet: Snippet, folders: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Run as a user would: a script in a folder holding ``train/`` and ``val/``."""
    work = tmp_path / "work"
    shutil.copytree(folders, work)
    script = work / ("snippet.sh" if snippet.lang == "bash" else "snippet.py")
    script.write_text(snippet.code)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    if snippet.kind == "s3":
        env.update(request.getfixturevalue("bucket"))
    done = subprocess.run(
        _command(snippet, script), cwd=work, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, (
        f"{snippet.id} exited {done.returncode}\n--- code\n{snippet.code}\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-6000:]}"
    )


def test_every_page_has_its_examples_found() -> None:
    """The parser sees the examples the pages hold (a page whose fences it missed would pass
    by running nothing): each python fence of each page is one snippet."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        fences = len(re.findall(r"^\s*```python\s*$", page.read_text(), flags=re.M))
        assert len([s for s in snippets(page) if s.lang == "python"]) == fences, page
    assert len(SNIPPETS) >= 20


def test_markers_are_read_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import docsnippets

    monkeypatch.setattr(docsnippets, "ROOT", tmp_path)
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\na = 1\n```\n\n<!-- run: continue -->\n```python\nprint(a)\n```\n\n"
        '=== "tab"\n\n    <!-- run: cuda -->\n    ```python\n    import torch\n    ```\n\n'
        "```bash\npip install x\n```\n\n<!-- run: sh -->\n```bash\naioloader doctor\n```\n"
    )
    got = [(s.line, s.kind, s.lang, s.code) for s in snippets(page)]
    assert got == [
        (3, "plain", "python", "a = 1\n"),
        (8, "plain", "python", "a = 1\nprint(a)\n"),
        (15, "cuda", "python", "import torch\n"),
        (24, "sh", "bash", "aioloader doctor\n"),
    ]
    page.write_text("<!-- run: gpu -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match=r"p.md:2: unknown marker <!-- run: gpu -->"):
        snippets(page)
    page.write_text("<!-- run: continue -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="nothing before it to continue"):
        snippets(page)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``mkdocs build --strict`` once for the module: how it ended, and the site's folder."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done, site


@pytest.mark.timeout(300)
def test_the_site_builds_strict(built: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """``mkdocs build --strict``: no broken link or anchor, no missing API reference."""
    done, site = built
    assert done.returncode == 0, done.stderr[-6000:]
    assert (site / "api" / "loader" / "index.html").is_file()


def _text(fragment: str) -> str:
    """An HTML fragment's text, as the browser shows it."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


@pytest.mark.timeout(300)
def test_the_api_pages_show_formatted_signatures_and_code_that_scrolls(
    built: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """In the built site: ``Loader``'s signature on the API page is formatted, one parameter
    a line, its ``decode`` default shown as the live default's repr (no private name: on
    no API page does a signature show one as a default); and the page's stylesheets make
    code blocks scroll sideways (``overflow-x``) rather than run past the right edge."""
    done, site = built
    assert done.returncode == 0, done.stderr[-6000:]
    page = (site / "api" / "loader" / "index.html").read_text()
    at = page.index('id="aioloader.Loader"')
    sig = re.search(r'<div class="doc-signature[^"]*"><pre>(.*?)</pre>', page[at:], flags=re.S)
    assert sig is not None, "no signature block for Loader"
    lines = [line.strip() for line in _text(sig.group(1)).strip().splitlines()]
    params = [p for p in inspect.signature(aioloader.Loader).parameters.values() if p.name != "self"]
    assert lines[0] == "Loader(" and lines[-1] == ")", lines
    starts = [line.split(":")[0] for line in lines[1:-1] if line != "*,"]
    assert starts == [p.name for p in params], lines  # one parameter a line, all of them
    default = repr(inspect.signature(aioloader.Loader).parameters["decode"].default)
    assert default == "ImageDecoder(224)"
    decode = next(line for line in lines if line.startswith("decode:"))
    assert decode.endswith(f"= {default},"), decode
    for api in (site / "api").rglob("index.html"):
        text = api.read_text()
        assert "_DEFAULT_DECODE" not in text, api
        for block in re.findall(r'<div class="doc-signature[^"]*"><pre>(.*?)</pre>', text, flags=re.S):
            assert not re.search(r"=\s*_\w", _text(block)), (api, _text(block))  # a private default
    # The stylesheets the built page links, read from the built site.
    sheets = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    css = "".join((site / "api" / "loader" / href.split("?")[0]).resolve().read_text() for href in sheets)
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    scrolls = [
        sel.strip()
        for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css)
        if re.search(r"\bpre\b", sel) and re.search(r"overflow-x\s*:\s*(auto|scroll)", body)
    ]
    assert any(re.search(r"\bpre\s*>\s*code\b", s) for s in scrolls), scrolls


def test_every_public_name_has_an_api_entry() -> None:
    documented: set[str] = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: aioloader\.(\w+)\s*$", page.read_text(), flags=re.M))
    public = set(aioloader.__all__) - {"__version__"}
    assert public - documented == set(), "no API entry"
    assert documented - public == set(), "an API entry for a name that is not public"
    assert "__version__" in (ROOT / "docs" / "api" / "loader.md").read_text()


def test_the_readme_is_short_and_keeps_its_promises() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for needed in (
        "aioloader demo",
        "python -m pytest",
        "max(T_load, T_train)",
        "[remote]",
        "[ray]",
        "[gpu]",
    ):
        assert needed in text, needed
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert target.startswith("http") or (ROOT / target).exists(), f"README links to {target}"
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    cited = re.findall(r"§(\d+)", text)
    assert len(cited) >= 5
    for section in cited:
        assert f"\n## {section}. " in results, f"§{section} is no section of benchmarks/RESULTS.md"


def test_cuda_examples_are_told_apart() -> None:
    """A block that puts tensors on a GPU is marked ``cuda`` (else CPU CI would fail it, or
    a GPU machine would skip nothing)."""
    for s in SNIPPETS:
        if re.search(r"""device\s*=\s*["']cuda""", s.code):
            assert s.kind == "cuda", s.id


def _prose(text: str) -> str:
    """``text`` without its fenced blocks: what a reader takes for references, not code."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.M | re.S)


def test_every_file_the_pages_name_is_in_the_repository() -> None:
    """README.md and every page of ``docs/`` name only files a clone has: each relative link
    resolves (from the page's folder), and each `path` in backticks that names a Markdown file
    or starts with a top-level folder (``benchmarks/RESULTS.md``, ``examples/``) exists, from
    the root or the page's folder. (The README once pointed to a ``DESIGN.md`` that is not in
    the repository.)"""
    top = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = _prose(page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path) and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)} links to {target}")
        for name in re.findall(r"`([\w.\-]+(?:/[\w.\-]*)*)`", text):
            in_repo = name.endswith(".md") or ("/" in name and name.split("/")[0] in top)
            if in_repo and not ((ROOT / name).exists() or (page.parent / name).exists()):
                missing.append(f"{page.relative_to(ROOT)} names {name}")
    assert missing == []


def test_install_commands_work_from_a_clone() -> None:
    """aioloader is not on PyPI yet: no ``pip install`` line of the README or the docs asks
    for it by name (``aioloader``, ``"aioloader[remote]"``); they install the checkout (``.``,
    ``".[remote]"``), and every extra they name is one pyproject.toml declares."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = set(re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1], re.M))
    lines = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for fence in re.findall(r"^\s*```(?:bash|console|sh)\n(.*?)^\s*```", page.read_text(), re.M | re.S):
            lines += [(page, line) for line in fence.splitlines() if "pip install" in line]
    assert len(lines) >= 5
    for page, line in lines:
        for command in re.findall(r"pip install ([^&#|;]*)", line):
            for arg in command.split():
                package = arg.strip("'\"")
                assert not re.match(r"aioloader(\[|$)", package), f"{page.name}: {line.strip()}"
                if package.startswith(".["):
                    extras = package[2:].rstrip("]").split(",")
                    assert set(extras) <= declared, f"{page.name}: {line.strip()}"

"""The built site in a real browser (headless Chromium, ``browser.py``): the home page, a
guide, an API page and the diagrams' page load with no console error, no uncaught exception
and no failed request (the site is whole offline: fonts off, Mermaid served by the site),
and each Mermaid diagram is drawn. Screenshots go to ``$AIOLOADER_SCREENSHOTS`` when set.

Skipped where no Chromium is installed (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Chromium, find_chromium
from docsnippets import ROOT
from servers import Server, _wait_listening, free_port

BINARY = find_chromium()
pytestmark = [
    pytest.mark.skipif(BINARY is None, reason="no chromium installed (apt-get install chromium)"),
    pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="not a checkout: no docs/"),
    pytest.mark.timeout(300),
]

#: page -> what it must show: (the page's path in the site, a CSS selector that matches).
PAGES = {
    "home": ("", "article h1"),
    "guide": ("guides/tuning/", "article h1"),
    "api": ("api/loader/", "article .doc-class"),
    "diagrams": ("how-it-works/", "article .mermaid"),
}

#: Once the page settled: how many elements match its selector, how many Mermaid blocks it
#: has, and how many of them were drawn. Material draws each into a closed shadow root that
#: replaces the ``pre.mermaid`` holding the source: a drawn one is a ``div.mermaid`` with a
#: height (one left unparsed stays a ``pre``; one that failed to parse logs an error).
PROBE = """(() => ({
  matches: document.querySelectorAll(%r).length,
  mermaid: document.querySelectorAll('pre.mermaid, div.mermaid').length,
  drawn: [...document.querySelectorAll('div.mermaid')].filter(
    m => m.getBoundingClientRect().height > 50).length,
  title: document.title,
}))()"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built (``mkdocs build --strict``) and served on 127.0.0.1 by
    ``python -m http.server``, stopped by PID."""
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=240,
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server(proc, f"http://127.0.0.1:{port}")
    try:
        _wait_listening(proc, port, "the site's http.server")
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Chromium]:
    """One browser per test (its processes are the test's, gone when it ends)."""
    assert BINARY is not None
    browser = Chromium(BINARY, tmp_path / "profile")
    try:
        yield browser
    finally:
        browser.close()


@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_loads_whole_with_no_console_error(page: str, site: str, chromium: Chromium) -> None:
    path, selector = PAGES[page]
    visit = chromium.visit(f"{site}/{path}", PROBE % selector, settle=2.0)
    if os.environ.get("AIOLOADER_SCREENSHOTS"):
        shots = Path(os.environ["AIOLOADER_SCREENSHOTS"])
        shots.mkdir(parents=True, exist_ok=True)
        (shots / f"{page}.png").write_bytes(visit.png)
    assert visit.errors == [], visit.url
    assert visit.value["matches"] >= 1, (visit.url, selector, visit.value)
    assert visit.value["drawn"] == visit.value["mermaid"], ("a Mermaid diagram was not drawn", visit.value)
    assert visit.png.startswith(b"\x89PNG")
    assert visit.value["title"].endswith("aioloader")


def test_a_missing_script_is_reported(site: str, chromium: Chromium, tmp_path: Path) -> None:
    """The check can fail: a page whose script throws, and which asks for a file the server
    does not have, is reported with both."""
    visit = chromium.visit(f"{site}/no-such-page/", "null", settle=0.5)
    assert any("404" in e for e in visit.errors), visit.errors
    visit = chromium.visit(
        "data:text/html,<script>console.error('drawn wrong'); undefined_name()</script>", "null", 0.5
    )
    assert any("drawn wrong" in e for e in visit.errors), visit.errors
    assert any("undefined_name" in e for e in visit.errors), visit.errors

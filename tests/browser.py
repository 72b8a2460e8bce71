"""A real browser for the documentation tests: headless Chromium driven over the Chrome
DevTools Protocol (a websocket, through aiohttp, which the ``remote`` extra already brings).

Why not Playwright or Selenium: both fetch or expect a browser build of their own, and this
machine has Debian's ``chromium`` and no route to a browser download. The protocol part we
need is small: open a page, wait for its load, collect what it logged, evaluate one
expression, take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class PageVisit:
    """What one page did: ``errors`` (console errors, uncaught exceptions, failed loads, as
    text), ``value`` (the expression evaluated once it settled) and ``png`` (a screenshot)."""

    url: str
    errors: list[str] = field(default_factory=list)
    value: Any = None
    png: bytes = b""


class Chromium:
    """``chromium --headless`` in a session of its own (stopped with its whole process
    group), with a throwaway profile under ``profile``."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.profile = profile
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # CI runs as root, where the sandbox refuses to start
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--window-size=1280,900",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.port = self._port()

    def _port(self, timeout: float = 60.0) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}")
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"chromium wrote no {marker} within {timeout} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def visit(self, url: str, expression: str = "null", settle: float = 1.5) -> PageVisit:
        return asyncio.run(asyncio.wait_for(self._visit(url, expression, settle), 90))

    async def _visit(self, url: str, expression: str, settle: float) -> PageVisit:
        visit = PageVisit(url)
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
                target = await r.json()
            try:
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    await _Session(ws, visit).run(url, expression, settle)
            finally:
                async with http.get(f"http://127.0.0.1:{self.port}/json/close/{target['id']}"):
                    pass
        return visit


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, visit: PageVisit) -> None:
        self.ws, self.visit, self.ids = ws, visit, itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.loaded = asyncio.Event()
        self.requested: dict[str, str] = {}

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        reply = self.waiting[n] = asyncio.get_running_loop().create_future()
        await self.ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
        return await reply

    async def _listen(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.waiting:
                reply = self.waiting.pop(data["id"])
                if "error" in data:
                    reply.set_exception(RuntimeError(f"{data['error']}"))
                else:
                    reply.set_result(data.get("result", {}))
            else:
                self._event(data.get("method", ""), data.get("params", {}))

    def _event(self, method: str, p: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self.loaded.set()
        elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            texts = (str(a.get("value", a.get("description", ""))) for a in p["args"])
            self.visit.errors.append("console: " + " ".join(texts))
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.visit.errors.append(f"exception: {d.get('exception', {}).get('description', d['text'])}")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            e = p["entry"]
            self.visit.errors.append(f"log: {e['text']} {e.get('url', '')}".rstrip())
        elif method == "Network.requestWillBeSent":
            self.requested[p["requestId"]] = p["request"]["url"]
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            self.visit.errors.append(f"network: {p['errorText']} {self.requested.get(p['requestId'], '')}")

    async def run(self, url: str, expression: str, settle: float) -> None:
        listener = asyncio.create_task(self._listen())
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                await self.call(f"{domain}.enable")
            await self.call("Page.navigate", url=url)
            await self.loaded.wait()
            await asyncio.sleep(settle)  # scripts that draw after load (Mermaid, search)
            got = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
            self.visit.value = got.get("result", {}).get("value")
            shot = await self.call("Page.captureScreenshot", format="png")
            self.visit.png = base64.b64decode(shot["data"])
        finally:
            listener.cancel()

"""Real servers on loopback for the remote-storage tests (and benchmarks/remote.py): moto's S3
server and an aiohttp file server that can add latency and inject faults. Each runs as a
subprocess on 127.0.0.1 at a free port and is stopped by its PID.

The file server is this module run as a script::

    python tests/servers.py ROOT PORT             # serves the files under ROOT
    python tests/servers.py --proxy URL PORT      # relays every request to URL (moto)
    python tests/servers.py --moto-filled PORT BUCKET COUNT CLASSES   # moto, with objects

As a proxy it stands in front of moto so that S3 gets the same latency and faults as the
file server: each request waits, may fail, then goes upstream as it came; its failures
carry an S3 error body (503 ``SlowDown``, 403 ``AccessDenied``, ...) and a body it cuts
short is moto's answer cut short. ``--moto-filled`` puts COUNT empty objects in BUCKET
(``train/class_KK/NNNNNNN.jpg``) through moto's own backend before serving, a hundred
thousand in seconds where uploads would take minutes.

``POST /_control`` with a JSON body sets, for every later request: ``latency_ms`` (added to
each response), ``fail_first`` (the first N requests of each path answer 503; with
``fail_share`` below 1, only that share of the paths, chosen by a hash of the path),
``reset_every`` (every K-th response is cut short: headers announce the full length, the
connection drops halfway through the body), ``fail_status`` (the status of those
failures, default 503), ``fail_paths`` (paths, relative to the server's root, that always
answer ``fail_status``: one object refused, say) and ``hold_until`` (requests are held,
before their latency, until that many are in flight at once; then every request goes
through, until the next ``_control``; a hang guard lets them all go after ``hold_s``,
default 30) and ``versions`` (whole-file answers carry ``ETag`` and ``Last-Modified``, as
byte ranges always do; off by default: a server that gives no version) and ``mbps`` (each
answer's body sent at most that many MB/s, as a far store serves one stream: 0, the
default, as fast as it goes). ``GET /_stats``
(:func:`server_stats`) returns the request count and the most requests in flight at once
since the last ``_control``; ``GET /_requests`` (:func:`server_requests`), the requests
since the last ``_control`` by method and path (``"HEAD /bucket/key": 1``), so a test tells
a HEAD from a GET.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "RUNNING",
    "Server",
    "CONTROL_DEFAULTS",
    "control",
    "free_port",
    "s3_client",
    "server_requests",
    "server_stats",
    "start_file_server",
    "moto_reader",
    "start_moto",
    "start_proxy",
]

#: PIDs of the servers running now: process-wide helpers, like the fork server, for the
#: tests' leak checks (tests/helpers.py, ``shared_helper_pids``).
RUNNING: set[int] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server subprocess at ``url``; :meth:`stop` ends it by its PID."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url
        RUNNING.add(proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        RUNNING.discard(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


def start_moto(check_credentials: bool = False, filled: tuple[str, int, int] | None = None) -> Server:
    """moto's S3 server (``moto[server]``) on 127.0.0.1. It accepts any credentials, unless
    ``check_credentials``: then keys it does not know are refused (InvalidAccessKeyId), a
    known key with another secret too (SignatureDoesNotMatch); :func:`moto_reader` makes a
    known one.
    ``filled=(bucket, count, classes)``: that bucket holds ``count`` empty objects under
    ``train/class_KK/`` (see the module docstring)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else None
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    if filled is not None:
        cmd = [sys.executable, os.path.abspath(__file__), "--moto-filled", str(port), *map(str, filled)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    _wait_listening(proc, port, "moto's S3 server", timeout=300.0)
    return Server(proc, f"http://127.0.0.1:{port}")


def start_file_server(root: Path) -> Server:
    """The aiohttp file server of this module, serving ``root``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(root), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_listening(proc, port, "the file server")
    return Server(proc, f"http://127.0.0.1:{port}")


def start_proxy(upstream: str) -> Server:
    """This module's server relaying to ``upstream`` (latency and faults set by
    :func:`control`, as for the file server)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--proxy", upstream, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_listening(proc, port, "the proxy")
    return Server(proc, f"http://127.0.0.1:{port}")


def s3_client(options: dict[str, object]) -> Any:
    """A boto3 S3 client for a moto server, from the loader's ``storage_options`` for it."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=str(options["endpoint_url"]),
        aws_access_key_id=str(options["key"]),
        aws_secret_access_key=str(options["secret"]),
        region_name="us-east-1",
    )


def moto_reader(
    url: str, bucket: str, objects: dict[str, str], denied: tuple[str, ...] = ()
) -> tuple[str, str]:
    """On a moto server started with ``check_credentials``: ``bucket`` holding ``objects``
    (``{key: local path}``), and a user whose policy allows every S3 action but
    ``s3:GetObject`` on the ``denied`` keys (their reads are AccessDenied, 403); returns the
    user's ``(access key id, secret)``. Checks are off while this sets up (moto's
    ``/moto-api/reset-auth``) and on again after it."""
    import json
    import urllib.request

    import boto3

    def checks_after(count: str) -> None:
        req = urllib.request.Request(
            f"{url}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    checks_after("inf")
    try:
        kw: dict[str, Any] = {
            "endpoint_url": url,
            "region_name": "us-east-1",
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="reader")
        statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]
        if denied:
            arns = [f"arn:aws:s3:::{bucket}/{key}" for key in denied]
            statements.append({"Effect": "Deny", "Action": "s3:GetObject", "Resource": arns})
        policy = json.dumps({"Version": "2012-10-17", "Statement": statements})
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=policy)
        made = iam.create_access_key(UserName="reader")["AccessKey"]
        s3 = boto3.client("s3", **kw)
        s3.create_bucket(Bucket=bucket)
        for key, path in objects.items():
            s3.upload_file(path, bucket, key)
    finally:
        checks_after("0")
    return str(made["AccessKeyId"]), str(made["SecretAccessKey"])


#: What ``/_control`` sets, as a server starts (no latency, no faults, nothing held).
CONTROL_DEFAULTS: dict[str, object] = {
    "latency_ms": 0.0,
    "fail_first": 0,
    "fail_share": 1.0,
    "reset_every": 0,
    "fail_status": 503,
    "fail_paths": [],
    "hold_until": 0,
    "hold_s": 30.0,
    "versions": False,
    "mbps": 0.0,
}

#: The S3 error code the proxy's failures carry, by status.
S3_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}


def control(url: str, **settings: object) -> None:
    """Set the file server at ``url``'s latency and faults (see the module docstring)."""
    import json
    import urllib.request

    req = urllib.request.Request(f"{url}/_control", data=json.dumps(settings).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass


def server_stats(url: str) -> dict[str, int]:
    """The file server at ``url``'s ``requests`` (since it started) and ``max_in_flight``
    (the most requests it held at once since the last :func:`control`)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/_stats", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def server_requests(url: str) -> dict[str, int]:
    """The requests the file server or proxy at ``url`` answered since the last
    :func:`control`, counted by ``"METHOD /path"`` (the query left out)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/_requests", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _serve(root: Path | None, port: int, upstream: str | None = None) -> None:  # pragma: no cover
    """The file server (``root``) or the proxy (``upstream``); runs in the server process."""
    import asyncio
    import zlib
    from collections import Counter

    import aiohttp
    from aiohttp import web

    #: What the proxy passes on each way (hop-by-hop headers and Host stay behind).
    keep_up = ("Range", "Authorization", "X-Amz-Date", "X-Amz-Content-Sha256", "X-Amz-Security-Token")
    keep_down = (
        "Content-Type",
        "Content-Range",
        "ETag",
        "Last-Modified",
        "Accept-Ranges",
        "x-amz-request-id",
    )
    session: list[aiohttp.ClientSession] = []

    control = dict(CONTROL_DEFAULTS)
    seen: Counter[str] = Counter()
    calls: Counter[str] = Counter()  # "METHOD /path" since the last _control
    total = [0]
    flight = {"now": 0, "max": 0}
    released = [asyncio.Event()]  # set once hold_until requests were in flight together

    async def set_control(request: web.Request) -> web.Response:
        control.update(await request.json())
        seen.clear()
        calls.clear()
        flight["max"] = flight["now"]
        released[0] = asyncio.Event()
        return web.json_response(control)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": total[0], "max_in_flight": flight["max"]})

    async def requests(request: web.Request) -> web.Response:
        return web.json_response(dict(calls))

    async def serve_file(request: web.Request) -> web.StreamResponse:
        total[0] += 1
        calls[f"{request.method} {request.path}"] += 1
        flight["now"] += 1
        flight["max"] = max(flight["max"], flight["now"])
        try:
            return await answer(request)
        finally:
            flight["now"] -= 1

    async def answer(request: web.Request) -> web.StreamResponse:
        hold, release = int(control["hold_until"]), released[0]
        if hold and not release.is_set():
            if flight["now"] >= hold:
                release.set()
            else:
                try:
                    await asyncio.wait_for(release.wait(), float(control["hold_s"]))
                except asyncio.TimeoutError:
                    release.set()  # the guard: all of them go, the test sees too few in flight
        rel = request.match_info["path"]
        if control["latency_ms"]:
            await asyncio.sleep(float(control["latency_ms"]) / 1e3)
        seen[rel] += 1
        chosen = zlib.crc32(rel.encode()) % 10_000 < float(control["fail_share"]) * 10_000
        if rel in control["fail_paths"] or (chosen and seen[rel] <= int(control["fail_first"])):
            return failure(int(control["fail_status"]))
        every = int(control["reset_every"])
        cut = bool(every and total[0] % every == 0)
        status = 200
        if upstream is not None:
            status, data, down = await relay(request)
            if not (cut and status in (200, 206)):
                return web.Response(status=status, body=data, headers=down)
        else:
            assert root is not None
            path = (root / rel).resolve()
            if root not in path.parents or not path.is_file():
                return web.Response(status=404, text="no such object")
            if not cut:
                if control["mbps"] and request.method == "GET":
                    return await paced(request, path, float(control["mbps"]))
                if request.method == "HEAD" and not control["versions"]:  # the size, not the file read
                    head = web.StreamResponse(headers={"Content-Length": str(path.stat().st_size)})
                    await head.prepare(request)
                    return head
                if "Range" in request.headers or control["versions"]:
                    return web.FileResponse(path)  # answers the byte range; ETag, Last-Modified
                return web.Response(body=path.read_bytes())  # cheaper per request than FileResponse
            data, down = path.read_bytes(), {}
        resp = web.StreamResponse(status=status, headers={**down, "Content-Length": str(len(data))})
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.close()  # the body is cut short: the client sees a short payload
        return resp

    async def paced(request: web.Request, path: Path, mbps: float) -> web.StreamResponse:
        """The file, or the byte range asked for, at most ``mbps`` MB/s, in 64 KiB writes."""
        size = path.stat().st_size
        start, end, status, down = 0, size - 1, 200, {"ETag": f'"{size}-{path.stat().st_mtime_ns}"'}
        asked = request.headers.get("Range", "")
        if asked.startswith("bytes="):
            first, _, last = asked[6:].partition("-")
            start, end, status = int(first), min(int(last) if last else size - 1, size - 1), 206
            down["Content-Range"] = f"bytes {start}-{end}/{size}"
        resp = web.StreamResponse(status=status, headers={**down, "Content-Length": str(end - start + 1)})
        await resp.prepare(request)
        t0, sent = time.perf_counter(), 0
        with open(path, "rb") as f:
            f.seek(start)
            while sent < end - start + 1:
                piece = f.read(min(65536, end - start + 1 - sent))
                await resp.write(piece)
                sent += len(piece)
                ahead = sent / (mbps * 1e6) - (time.perf_counter() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await resp.write_eof()
        return resp

    def failure(status: int) -> web.Response:
        if upstream is None:
            return web.Response(status=status, text="try again")
        code = S3_CODES.get(status, "ServiceUnavailable")
        body = f"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>{code}</Code></Error>"
        return web.Response(status=status, text=body, content_type="application/xml")

    async def relay(request: web.Request) -> tuple[int, bytes, dict[str, str]]:
        if not session:
            connector = aiohttp.TCPConnector(limit=0)
            session.append(aiohttp.ClientSession(connector=connector, auto_decompress=False))
        headers = {k: v for k, v in request.headers.items() if k in keep_up or k.lower().startswith("x-amz-")}
        async with session[0].get(f"{upstream}{request.path_qs}", headers=headers) as up:
            body = await up.read()
            down = {k: v for k, v in up.headers.items() if k in keep_down}
            return up.status, body, down

    app = web.Application()
    app.router.add_post("/_control", set_control)
    app.router.add_get("/_stats", stats)
    app.router.add_get("/_requests", requests)
    app.router.add_get("/{path:.*}", serve_file)
    # A backlog for thousands of connections opened at once (the default 128 drops SYNs).
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


def _moto_filled(port: int, bucket: str, count: int, classes: int) -> None:  # pragma: no cover
    """moto's server with ``count`` objects already in ``bucket``; runs in the server process."""
    from moto import server
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(bucket, "us-east-1")
    for i in range(count):
        backend.put_object(bucket, f"train/class_{i % classes:02d}/{i:07d}.jpg", b"")
    server.main(["-H", "127.0.0.1", "-p", str(port)])


if __name__ == "__main__":
    if sys.argv[1] == "--proxy":
        _serve(None, int(sys.argv[3]), upstream=sys.argv[2].rstrip("/"))
    elif sys.argv[1] == "--moto-filled":
        _moto_filled(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        _serve(Path(sys.argv[1]).resolve(), int(sys.argv[2]))

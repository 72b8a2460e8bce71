"""``decode_on="ray"`` where it cannot run: settings that cannot go with it, Ray missing, and
no cluster to connect to. This module starts no Ray instance: ``ray.init(address="auto")``
connects to any GCS process it finds on this machine (it scans the process table), so the
no-cluster case runs in a PID namespace of its own where it may, else while none is up
(test_ray.py's instance is shut down at the end of its module). The scripts run as
subprocesses, where nothing of this process's Ray state (imported or not, connected or
not) can help or hide the error."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import decode_number, script_env

from aioloader import Loader

pytest.importorskip("ray")


@pytest.mark.parametrize(
    ("kw", "shown"),
    [
        ({"decode": None}, "decode=None"),
        ({"num_workers": "auto"}, "num_workers='auto'"),
        ({"loader_process": True}, "loader_process=True"),
        ({"decode_on": "cluster"}, "decode_on='cluster'"),
    ],
)
def test_what_cannot_go_with_ray_is_a_value_error_showing_the_value(
    numbered: list[str], kw: dict[str, Any], shown: str
) -> None:
    args: dict[str, Any] = {"decode": decode_number, "decode_on": "ray", **kw}
    with pytest.raises(ValueError, match=re.escape(shown)):
        Loader(numbered, **args)


def run_script(
    tmp_path: Path, text: str, env: dict[str, str], prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    return subprocess.run(
        [*(prefix or []), sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )


#: Two ways Ray can be missing: not found at all (``sys.modules["ray"] = None``, what
#: ``import ray`` and ``find_spec`` see of a package that is not installed), and a finder
#: that refuses it (an environment that hides it: ``find_spec`` raises).
HIDE_RAY = {
    "none-in-sys-modules": """
        import sys
        sys.modules["ray"] = None
        """,
    "finder-refuses": """
        import importlib.abc, sys

        class NoRay(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "ray" or name.startswith("ray."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoRay())
        """,
}


@pytest.mark.parametrize("hide", sorted(HIDE_RAY))
def test_without_ray_installed_it_is_an_import_error_naming_the_extra(tmp_path: Path, hide: str) -> None:
    proc = run_script(
        tmp_path,
        textwrap.dedent(HIDE_RAY[hide])
        + textwrap.dedent(
            """
            from aioloader import Loader
            try:
                Loader(["a.jpg"], decode=len, decode_on="ray")
            except ImportError as exc:
                print("ImportError:", exc)
            Loader(["a.jpg"], decode=len)  # the local decode needs no Ray
            print("local: fine")
            """
        ),
        script_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "ImportError: decode_on='ray' needs Ray: pip install 'aioloader[ray]'",
        "local: fine",
    ]


def gcs_servers() -> list[int]:
    """Ray GCS processes running on this machine (anyone's): what ``address="auto"`` finds."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm == "gcs_server":
            out.append(int(entry.name))
    return out


def own_pid_namespace() -> list[str]:
    """The command prefix that runs a script in a PID namespace of its own with its own
    /proc (``unshare --pid --fork --mount-proc``: root), where no other Ray instance on the
    machine is seen; ``[]`` where that is not permitted."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else []


@pytest.mark.slow
def test_without_a_cluster_start_is_one_loader_error_saying_how_to_connect(
    tmp_path: Path, numbered: list[str]
) -> None:
    """No ray.init, no RAY_ADDRESS, no cluster file (a Ray temp folder of its own) and no GCS
    process in sight (a PID namespace of its own where permitted; else none may run on the
    machine): start() fails at once with one LoaderError saying how to connect, nothing
    hangs, and nothing is left connected."""
    prefix = own_pid_namespace()
    if not prefix:  # the machine's processes are seen: wait for test_ray.py's to go
        deadline = time.monotonic() + 10
        while gcs_servers() and time.monotonic() < deadline:
            time.sleep(0.1)
        if found := gcs_servers():
            pytest.skip(f"a Ray cluster runs on this machine (gcs_server {found}): address='auto' finds it")
    env = {k: v for k, v in script_env().items() if not k.startswith("RAY_")}
    env["RAY_TMPDIR"] = str(tmp_path / "ray")
    proc = run_script(
        tmp_path,
        f"""
        from aioloader import Loader, LoaderError
        from helpers import decode_number
        import ray
        loader = Loader({numbered[:4]!r}, batch_size=2, decode=decode_number, decode_on="ray")
        try:
            loader.start()
        except LoaderError as exc:
            print("LoaderError:", exc)
        finally:
            loader.close()
        print("connected:", ray.is_initialized())
        """,
        env,
        prefix,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("LoaderError: decode_on='ray': this process is not connected to a Ray cluster")
    assert "Call ray.init() before the loader starts" in lines[0] and "RAY_ADDRESS" in lines[0]
    assert lines[1] == "connected: False"

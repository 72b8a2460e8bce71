"""A real Jupyter kernel (ipykernel, driven by nbclient) running a notebook the way users
edit one: a cell defines ``decode``, a cell loads with it; the ``decode`` cell is edited and
run again, then the loading cell; a later cell defines a new function; a lambda; a top-level
``async for``. Each loader must run the function as it is when the loader is made.

The notebook runs in a driver subprocess (its ZMQ sockets and the kernel are its own, not
this test process's), with a kernel spec that starts this interpreter, once per runtime.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import KERNEL_SPEC, finish_script, start_script

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

DRIVER = (
    """
import json, os, sys

folder, runtime, jupyter = sys.argv[1:4]
"""
    + KERNEL_SPEC
    + """

import nbformat
from nbclient import NotebookClient

LOAD = '''
with aioloader.Loader(paths, batch_size=4, shuffle=False, decode=DECODE, num_workers=2,
                      loader_process=LP) as loader:
    batch = next(iter(loader))
print(json.dumps({"cell": NAME, "batch": batch.tolist()}))
'''
cells = [
    f"import glob, json\\nimport numpy as np\\nimport aioloader\\n"
    f"paths = sorted(glob.glob({folder!r} + '/*.txt'))\\nLP = {runtime == 'process'}",
    "def decode(data):\\n    return np.array([int(data[7:])])",
    LOAD.replace("DECODE", "decode").replace("NAME", "'first'"),
    "def decode(data):  # the cell, edited\\n    return np.array([int(data[7:]), -1])",
    LOAD.replace("DECODE", "decode").replace("NAME", "'edited'"),
    "def val_decode(data):  # a new cell, after loaders ran\\n    return np.array([int(data[7:]) * 100])",
    LOAD.replace("DECODE", "val_decode").replace("NAME", "'new'"),
    LOAD.replace("DECODE", "lambda data: np.array([7])").replace("NAME", "'lambda'"),
    '''sizes = []
async with aioloader.Loader(paths, batch_size=4, shuffle=False, decode=decode, num_workers=2,
                            loader_process=LP) as loader:
    async for b in loader:
        sizes.append(len(b))
print(json.dumps({"cell": "async", "samples": sum(sizes)}))''',
]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
NotebookClient(nb, timeout=60, kernel_name="aioloader-test").execute()
for cell in nb.cells:
    for out in cell.get("outputs", []):
        if out.get("name") == "stdout":
            sys.stdout.write(out["text"])
"""
)


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_a_notebook_cell_edited_and_run_again(tmp_path: Path, numbered: list[str], runtime: str) -> None:
    driver = tmp_path / "driver.py"
    args = [str(driver), os.path.dirname(numbered[0]), runtime, str(tmp_path / "jupyter")]
    proc = start_script(driver, DRIVER, args=args)
    out, err = finish_script(proc, timeout=100)
    assert proc.returncode == 0, err[-4000:]
    cells = {c["cell"]: c for c in map(json.loads, out.splitlines())}
    assert cells["first"]["batch"] == [[0], [1], [2], [3]]
    assert cells["edited"]["batch"] == [[0, -1], [1, -1], [2, -1], [3, -1]]  # not the old function
    assert cells["new"]["batch"] == [[0], [100], [200], [300]]  # not a crash
    assert cells["lambda"]["batch"] == [[7]] * 4
    assert cells["async"]["samples"] == len(numbered)

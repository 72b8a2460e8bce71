"""``benchmarks/cache.py``: its smoke check (``--quick``, with even fewer files) runs every
case, prints each in its table and writes each to its JSON. Nothing about time is
asserted: the figures are only checked to be there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import script_env

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "cache.py"
CASES = ("a", "b", "c", "d", "e", "e-A")
ROWS = [
    ("A", "DataLoader"),
    ("A", "aioloader, no cache"),
    ("A", "aioloader, Cache(max_side=512)"),
    ("B", "DataLoader"),
    ("B", "aioloader, no cache"),
    ("B", "aioloader, Cache(max_side=256)"),
    ("B", "aioloader, Cache()"),
    ("http", "aioloader, no cache"),
    ("http", "aioloader, Cache()"),
]


@pytest.mark.timeout(300)  # a guard against a hang: the run takes about 30 s on 2 idle cores
def test_quick_run_reports_every_case_in_the_table_and_the_json(tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    argv = ["--quick", "--files", "6", "--batch-size", "4", "--data-dir", str(tmp_path / "data")]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        env=script_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    for s, name in ROWS:
        assert f"\n| {s} | {name} | " in table, (s, name)
    for case in CASES:
        assert f"\n| {case} | " in table, case
    result = json.loads(out.read_text())
    assert set(result["cases"]) == set(CASES)
    for case, c in result["cases"].items():
        assert c["value"] > 0 and len(c["rounds"]) == 1, case
        assert (c["target"] is None) == (case == "e-A") and (c["met"] is None) == (case == "e-A")
    assert set(result["runs"]) == {f"{s} | {name}" for s, name in ROWS}
    for key, runs in result["runs"].items():
        (run,) = runs  # one round
        assert run["samples"] == [6, 6] and run["epoch1"] > 0 and run["epoch2"] > 0, key
        if "Cache" in key:  # every sample of epoch 2 served from the cache
            assert (run["hits"], run["misses"], run["stored"]) == (6, 0, 6), key
    (memory,) = result["memory"]["rounds"]
    assert memory["cache"]["hits"] == 6 and memory["cache"]["held"] > 0 and memory["none"]["held"] == 0
    assert memory["cache"]["peak_pss"] > 0 and memory["none"]["peak_pss"] > 0

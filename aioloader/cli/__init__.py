"""The ``aioloader`` command (also ``python -m aioloader``): the top wing, imported by none.

| module | role |
| --- | --- |
| ``main.py`` | the parser and the dispatch; the ``demo`` subcommand's options |
| ``args.py`` | argparse types shared by the subcommands |
| ``demo.py`` | ``aioloader demo``: the same training loop fed two ways |
| ``narrate.py`` | the demo's lines on any output: flushed; progress lines where no bar is drawn |
| ``bench.py`` | ``aioloader bench``: your data through the loader, and the verdict |
| ``benchreport.py`` | pure: what ``bench`` measured (its ``--json``) and the verdict it prints |
| ``cachebench.py`` | ``aioloader bench --cache``: epoch 1 filling a cache beside epoch 2 served from it |
| ``measure.py`` | a loader (or DataLoader) iterated for a time |
| ``tune.py`` | ``aioloader bench --tune``: the sweep of fixed settings beside ``"auto"`` |
| ``doctor.py`` | ``aioloader doctor``: the environment's findings, then the leftovers of dead loaders |
| ``envprobe.py`` | the doctor's measurements: torch, GPUs, CPUs, ``/dev/shm``, limits, memory, ranks |
| ``envadvice.py`` | pure: the doctor's findings and what to do, from measured facts |
| ``index.py`` | ``aioloader index``: tar shards' indexes written as sidecar ``.idx`` files |
"""

from aioloader.cli.main import main

__all__ = ["main"]

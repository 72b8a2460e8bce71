"""``io_concurrency="auto"`` and ``num_workers="auto"``: pure rules, and the tuner that
applies them while the engine runs. (The ``--tune`` sweep of fixed settings is a command:
``aioloader.cli.tune``.)

| module | role |
| --- | --- |
| ``rules.py`` | pure: reads in flight by Little's law within fd and memory bounds; workers by CPU |
| ``tuner.py`` | every 0.5 s: the meters and CPU clocks in; the reader's limit, window, slabs, decoders out |
"""

"""What the loader says about itself: ``loader.stats``, per-stage meters, the bottleneck
verdict, the progress bar and the Chrome trace. Below the stages it measures: they only
report to it.

| module | role |
| --- | --- |
| ``stats.py`` | ``LoaderStats`` and the counters behind it; the waiting trainer's warning |
| ``wheredecoded.py`` | where samples were decoded: Ray tasks, the device and the CPU workers |
| ``cachestats.py`` | ``CacheStats``: the sample cache's hits, misses and bytes held |
| ``stages.py`` | per-stage meters: items in flight against their bound, busy time, p50/p99 |
| ``trainerwait.py`` | the trainer's wait for batches, as the device decode's share is steered by it |
| ``bottleneck.py`` | pure: which stage limits throughput, and one sentence of advice |
| ``progressbar.py`` | ``progress=True``: the tqdm bar per epoch (terminal only unless ``"always"``) |
| ``trace.py`` | ``aioloader bench --trace``: every stage's items as Chrome trace events |
"""

"""What the loader says about itself: ``loader.stats``, per-stage meters, the bottleneck
verdict, the progress bar and the Chrome trace. Below the stages it measures: they only
report to it.

| module | role |
| --- | --- |
| ``stats.py`` | the counters behind ``LoaderStats``; the verdict's window; the waiting trainer's warning |
| ``loaderstats.py`` | ``LoaderStats``: the snapshot ``loader.stats`` returns |
| ``wheredecoded.py`` | where samples were decoded: Ray tasks, the device and the CPU workers |
| ``cachestats.py`` | ``CacheStats``: the sample cache's hits, misses and bytes held |
| ``stages.py`` | per-stage meters: items in flight against their bound, busy time, p50/p99 |
| ``trainerwait.py`` | the trainer's wait for batches, as the device decode's share is steered by it |
| ``loopmeter.py`` | the event loop's stage: its thread's CPU share, from a clock the runtime binds |
| ``bottleneck.py`` | pure: which of the stages that run limits throughput |
| ``advice.py`` | pure: the verdict's sentence, fitted to what the loader runs (``Setup``) |
| ``progressbar.py`` | ``progress=True``: the tqdm bar per epoch (terminal only unless ``"always"``) |
| ``trace.py`` | ``aioloader bench --trace``: every stage's items as Chrome trace events |
"""

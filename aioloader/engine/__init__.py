"""Stages 1-5 for one epoch, on the event loop: sample order -> reads -> decodes ->
collation -> the ready queue. Drives ``read/`` and ``decode/``, tuned by ``tune/``.

| module | role |
| --- | --- |
| ``epoch.py`` | the ``Engine``: the batch window, delivery order, chunking, repacking, the slab layout |
| ``decoding.py`` | which decode stage a loader has (Ray, local workers, none), chosen once when built |
| ``sizing.py`` | sizes (pure): the window, slabs and arenas kept, a batch's tasks, arena bytes |
| ``tasks.py`` | asyncio helpers: tasks that fail together, tasks cancelled and awaited |
| ``batch.py`` | one batch under construction: its slabs (rows, the probes' earlier ones, its arena) |
| ``opening.py`` | an epoch's opening: when later batches decode, the first batch's probes (states, pure) |
| ``assemble.py`` | stage 4: a batch from decoded rows (slab blocks as tensors, views to a collate) |
| ``failures.py`` | the failure policy: ``on_error``, ``max_failures`` over the loader's life |
| ``caching.py`` | where the engine meets the sample cache: hits served, decoded misses kept |
| ``settings.py`` | ``Delivery`` (collate, queue, order, device, runtime) and ``Failures``: their settings |
"""

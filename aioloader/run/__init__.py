"""Where a started loader lives: in the trainer's process, or in a loader process with the
trainer keeping only the bridge. Above the engine, below ``loader.py``.

| module | role |
| --- | --- |
| ``start.py`` | the device settled as a loader starts (``"cuda"``: the rank's GPU); which runtime starts |
| ``runtime.py`` | in-process: the ``aioloader-loop`` thread, the pipeline, the bridge, bounded shutdown |
| ``procruntime.py`` | the trainer's side of a loader process: the process, the bridge reading its messages |
| ``loaderproc.py`` | the loader process: the pipeline on its own loop, flow control, its two channels |
| ``messages.py`` | what the two say to each other: one type per message; the back pipe's lines, parsed once |
| ``wire.py`` | how a batch crosses between the two: slab views as references, large arrays spilled, errors |
| ``spills.py`` | the loader process's segments for spilled arrays, reused once the trainer lets go |
| ``pipeline.py`` | the loading parts (reader, decode pool, slabs, collate thread, engine), built and closed |
| ``bridge.py`` | stage 6's ``aioloader-transfer`` thread, the per-epoch ``Run``, its device decode made |
| ``device.py`` | the device copy: side stream, events, ``record_stream``, slabs held until copied |
| ``pinning.py`` | the trainer's slab mappings page-locked once for their life (``cudaHostRegister``) |
| ``decodeahead.py`` | the ``aioloader-decode`` thread: each batch's device decode started a batch ahead |
| ``staging.py`` | the fallback: pinned staging buffers filled by a single-threaded copy |
| ``handoff.py`` | the bridge -> trainer hand-off, for threads and coroutines |
| ``cursor.py`` | the consumer's side of a run: the ``for`` and ``async for`` iterators |
"""

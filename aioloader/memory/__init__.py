"""Shared memory every stage stands on: where file bytes land and decoded samples go, how
another process reaches it, and in which order the stages may use it. Below both ``read/``
(reads land in a slab's input arena) and ``decode/`` (decodes write its rows).

| module | role |
| --- | --- |
| ``lifecycle.py`` | the slab lifecycle as a contract: taken, out, free, closed, and the moves between |
| ``slabs.py`` | shared-memory batch slabs (rows slabs, input arenas) and their bounded pool |
| ``segments.py`` | the memory under a slab (memfd, else ``/dev/shm``) and how another process maps it |
| ``layout.py`` | pure: where samples go in a slab; the layout learned from the samples themselves |
| ``results.py`` | what a slab's rows hold once decoded: typed results per sample, the status table |
| ``writer.py`` | one decoded sample written into its row, or the chunk's share of the output area |
| ``slots.py`` | ordered waiters and slots: granted by key (epoch order), not by arrival |

Nothing here decodes, reads or starts a process.
"""

"""The sample cache (``Loader(..., cache=aioloader.Cache(...))``): the bytes each sample's
decode receives, kept as the first epoch reads them, read from here by the later ones. Below
``engine/`` (which serves and fills it, ``engine/caching.py``), above ``read/``; its
downscale runs in the decode workers (``decode/shrink.py``).

| module | role |
| --- | --- |
| ``settings.py`` | ``Cache``: the settings a user gives, checked; the bound a loader keeps to |
| ``entries.py`` | pure: an entry's key (source, identity, settings) and its file's header |
| ``memstore.py`` | a memory cache: append-only regions of anonymous memory, in one process |
| ``diskstore.py`` | a disk cache: one file per entry, written aside then renamed; checked when read |
| ``identity.py`` | a sample's source version: a stat per file per epoch, a HEAD per object per run |
| ``samples.py`` | ``SampleCache``: on the loader's loop, which samples are hits, which to fill |
"""

from aioloader.cache.settings import Cache

__all__ = ["Cache"]

"""Stage 2, reading: local files on daemon threads, URLs on the event loop. Above
``decode/``: reads land in a decode slab's arena.

| module | role |
| --- | --- |
| ``reader.py`` | ``FileReader``: reads in flight within a limit, retries, failures as ``ReadError`` |
| ``blocking.py`` | what runs on a read thread: a file, a byte range, a custom ``read``, a fast group |
| ``remote.py`` | URLs read: one client per protocol, fault classes, prefix listing |
| ``urls.py`` | URLs as strings: scheme, ``file://``, redaction, one protocol's ``storage_options`` |
| ``backends.py`` | the clients: fsspec's async filesystems, obstore (loader process only), the choice |
"""

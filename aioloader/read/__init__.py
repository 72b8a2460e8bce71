"""Stage 2, reading: local files on daemon threads, URLs on the event loop. Above
``decode/``: reads land in a decode slab's arena.

| module | role |
| --- | --- |
| ``reader.py`` | ``FileReader``: reads in flight within a limit, retries, failures as ``ReadError`` |
| ``blocking.py`` | what runs on a read thread (or the loop): a file, a byte range, a custom ``read``, a fast group |
| ``routing.py`` | pure: which way a chunk of reads goes (on the loop, a group on a thread, one per hop) |
| ``mounts.py`` | which filesystems answer a read whole but at the end (a size hint may skip the fstat) |
| ``remote.py`` | URLs read: one client per protocol, fault classes, prefix listing |
| ``urls.py`` | URLs as strings: scheme, ``file://``, redaction, one protocol's ``storage_options`` |
| ``backends.py`` | the clients: fsspec's async filesystems, obstore (loader process only), the choice |
"""

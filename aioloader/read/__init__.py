"""Stage 2, reading: fast local files in groups on the event loop, slow ones on daemon
threads, URLs on the event loop. Above
``decode/``: reads land in a decode slab's arena.

| module | role |
| --- | --- |
| ``reader.py`` | ``FileReader``: reads in flight within a limit, retries, failures as ``ReadError`` |
| ``blocking.py`` | on a read thread (or the loop): a file, a byte range, a custom ``read``; the pace |
| ``groups.py`` | fast groups: a chunk's files read one after another while reads are fast |
| ``outcomes.py`` | a read's result as the sample's bytes or its ``ReadError``; transient errors, backoff |
| ``routing.py`` | pure: which way a chunk of reads goes (reader processes, the loop, a thread, one per hop) |
| ``workers.py`` | reader processes (``decode=None``): groups of small local files read elsewhere |
| ``readproc.py`` | what runs in a reader process: each group read into its part of a shared buffer |
| ``readmsgs.py`` | a reader process's messages: ``Group`` (framed and parsed once), ``GroupRead`` |
| ``mounts.py`` | which filesystems answer a read whole but at the end (a size hint may skip the fstat) |
| ``remote.py`` | URLs read: one client per protocol, fault classes, prefix listing |
| ``urls.py`` | URLs as strings: scheme, ``file://``, redaction, ``storage_options`` (S3's: as botocore's) |
| ``backends.py`` | the clients: fsspec's async filesystems, obstore (loader process only), the choice |
| ``tars.py`` | pure: tar headers (ustar, GNU, pax), members to WebDataset samples, brace notation |
| ``tarsample.py`` | a sample's other members for the decode (its range split), member names for errors |
| ``tarscan.py`` | a shard's index: the scan (local: seeks past data), its format, sidecars, the cache |
| ``tarranges.py`` | a remote shard read where its parser reads: GETs front to back, jumps past big members |
| ``tarindex.py`` | the indexes of a shard list: local ones on threads, remote ones read on a loop apart |
| ``settings.py`` | ``Reading``: the reading part's settings (reads in flight, ``read``, retries, storage) |
"""

"""Decoding beyond one machine: ``decode_on="ray"`` runs the decode stage as Ray tasks.

The engine, the reads of local files, the slabs, the order, the failure policy and the
bridge are the local loader's; only the decode of a chunk moves to the cluster::

    engine (trainer's process, aioloader-loop thread)
      reads local files -> bytes ──┐                 ┌─> task.decode_task on a Ray worker:
      URLs stay URLs ──────────────┤  session.submit │     reads its URLs (storage_options),
                                   └───────────────> │     decodes, seeded (seed, epoch, index)
      stage.RayDecodeStage  <── one object per chunk ┘
        writes each sample into the batch's slab (the one copy), or a SampleError
        faults.Recovery decides what a lost task becomes: split, retry, poison, timeout

| module | role |
| --- | --- |
| ``connect.py`` | Ray imported and this process connected, or one clear error; the cluster's CPUs |
| ``session.py`` | one loader's tasks: the remote function, the decode put once, none left running by close |
| ``task.py`` | on the cluster: URLs read there, the chunk decoded as locally, ``sample_timeout`` by SIGALRM |
| ``faults.py`` | pure: what a task that failed without an answer becomes (split, retry, poison, timeout) |
| ``stage.py`` | the decode stage the engine awaits (a ``DecodeStageLike``): slots, answers into the slab |
"""

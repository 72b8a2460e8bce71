"""The vocabulary every wing speaks, below all of them but ``safety/`` and ``errors``.

| module | role |
| --- | --- |
| ``items.py`` | what travels from the engine to the trainer: ``Batch``, ``Failure``, ``End`` |
| ``tree.py`` | the one walker over nested samples and batches (collate, device copy, repack, slabs) |
| ``sendable.py`` | callables sent by value (cloudpickle), with errors that name the argument |
| ``threads.py`` | daemon I/O threads (a hung read never blocks exit); lifecycle calls; thread CPU clocks |
| ``cpus.py`` | the CPU quota of this process's own cgroup and its ancestors (``/proc/self/cgroup``) |
| ``cgmemory.py`` | memory this process may still take: ``MemAvailable`` and its cgroups' memory limits |
| ``semnames.py`` | semaphores named ``sem.mp-aioloader-<pid>-``, loky notwithstanding |
| ``heap.py`` | memory the first, pickled batches left in malloc's arenas, given back (``malloc_trim``) |
| ``checks.py`` | the checks every part's settings share: positive ints, flags, callables |
"""

"""Nothing outlives the trainer, and a crash leaves nothing behind: the lowest wing but
``errors``, so every process can use it before anything else.

| module | role |
| --- | --- |
| ``lifeline.py`` | helpers end with the trainer (death signal, a pipe) |
| ``sigterm.py`` | SIGTERM closes open loaders, then ends the process; a user's handler is kept |
| ``gcfreeze.py`` | the cyclic GC while a loader is open: what existed at start is frozen |
| ``doctor.py`` | ``aioloader doctor``: shared memory of loaders whose process is gone, listed and removed |
"""

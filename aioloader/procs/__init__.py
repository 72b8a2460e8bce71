"""Making aioloader's helper processes: the zygote they are forked from, how they start (never
running the training script, with the trainer's environment of now), and what each is.

| module | role |
| --- | --- |
| ``zygote.py`` | the fork server made when the first loader is made; ends with the trainer |
| ``forksafe.py`` | the fork-safety rules: the threads a fork may pass, what the copy does first |
| ``cleanstart.py`` | the zygote's other start: a fresh interpreter that preloads what the helpers import |
| ``forking.py`` | how helpers start: no main module, the asking process's environment, ``sys.path`` and cwd |
| ``roles.py`` | each helper's role and its whole name in ``ps``/``top`` (``aioloader-fork``, ...) |

How a helper ends with the trainer is ``safety/``'s (:mod:`aioloader.safety.lifeline`).
"""

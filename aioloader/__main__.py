"""``python -m aioloader ...``: the same command line as the ``aioloader`` script.

Guarded by ``__name__``: decode workers re-import the main module (as ``__mp_main__``) and
must not run the command again.
"""

from __future__ import annotations

import sys

from aioloader.cli import main

if __name__ == "__main__":
    sys.exit(main())

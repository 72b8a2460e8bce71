"""A griffe extension for the API pages: a parameter whose default is a private sentinel
(``decode=_DEFAULT_DECODE`` in ``Loader``) is shown with the sentinel's ``repr`` (the
default it stands for, ``ImageDecoder(224)``), never with a private name a reader cannot
use. The object is imported to read it; a sentinel whose ``repr`` is Python's default
``<... object at 0x...>`` stops the build, naming the function and the parameter."""

from __future__ import annotations

import importlib
from typing import Any

import griffe


class ShownDefaults(griffe.Extension):
    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for param in func.parameters:
            default = param.default
            if not (isinstance(default, griffe.ExprName) and default.name.startswith("_")):
                continue
            value = getattr(importlib.import_module(func.module.path), default.name)
            shown = repr(value)
            if shown.startswith("<"):
                raise ValueError(
                    f"{func.path}: the default of {param.name!r} is the private {default.name} "
                    f"with no readable repr ({shown}): give it a __repr__ that says what it means"
                )
            param.default = shown

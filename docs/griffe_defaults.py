"""A griffe extension for the API pages: a parameter whose default is read from where its
part defines it (``batch_size=Sampling.batch_size`` in ``Loader``), or is a private
sentinel, is shown with the value's ``repr`` (``256``, ``'auto'``; for the default decode,
the ``ImageDecoder(224)`` it stands for), never with a name a reader cannot use. The object is imported to read it; a sentinel whose ``repr`` is Python's default
``<... object at 0x...>`` stops the build, naming the function and the parameter."""

from __future__ import annotations

import importlib
from typing import Any

import griffe


class ShownDefaults(griffe.Extension):
    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for param in func.parameters:
            default = param.default
            module = vars(importlib.import_module(func.module.path))
            owner, _, field = str(default).partition(".")
            if isinstance(default, griffe.ExprAttribute) and hasattr(module.get(owner), "__dataclass_fields__"):
                value = getattr(module[owner], field)  # a part's default: Sampling.batch_size
            elif isinstance(default, griffe.ExprName) and default.name.startswith("_"):
                value = module[default.name]
            else:
                continue
            shown = repr(value)
            if shown.startswith("<"):
                raise ValueError(
                    f"{func.path}: the default of {param.name!r} is {default} "
                    f"with no readable repr ({shown}): give it a __repr__ that says what it means"
                )
            param.default = shown

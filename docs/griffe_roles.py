"""A griffe extension for the API pages: the package's docstrings use Sphinx roles
(``:class:`LoaderStats```, ``:meth:`close```, ``:func:`~aioloader.config.usable_cpus```),
which Markdown would show as literal text. Each becomes a code span of the name as a
reader writes it (the last dotted part where the role says ``~``)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)

"""The one walker over nested samples and batches (pure; no torch import).

A sample or a batch is a tree: ``dict`` (any ``Mapping``), ``tuple``, namedtuple and
``list`` nodes, and leaves (arrays, tensors, numbers, strings, ``None``, anything else).
:func:`flatten` splits a value into a hashable, picklable :data:`TreeDef` and its leaves in
order; :func:`unflatten` rebuilds it. Collation (``collate.py``), the device copy
(``run/device.py``), batch regrouping (``plan/repack.py``) and the shared-memory decode path
(``decode/layout.py``) all walk values through these three functions, so they agree on what
a node is.

A ``TreeDef`` is ``LEAF`` or ``(kind, key, children)`` where ``kind`` is ``"dict"``,
``"tuple"``, ``"list"`` or ``"named"``, ``key`` the dict's keys or the namedtuple's type
(else None) and ``children`` a tuple of ``TreeDef``. Two samples have the same structure iff
their ``TreeDef`` compare equal.
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Callable
from typing import Any

__all__ = ["LEAF", "TreeDef", "count_leaves", "flatten", "map_leaves", "unflatten"]

LEAF = "*"
TreeDef = Any  # LEAF | tuple[str, Any, tuple[TreeDef, ...]]

IsLeaf = Callable[[Any], bool]


def flatten(value: Any, is_leaf: IsLeaf | None = None) -> tuple[TreeDef, list[Any]]:
    """``(treedef, leaves)``; ``is_leaf(x)`` True stops the descent at ``x``."""
    leaves: list[Any] = []
    return _flatten(value, leaves, is_leaf), leaves


#: Types known to be leaves: no ``Mapping`` check (an ABC's, slow) for a batch of file
#: bytes or arrays. Other types join once seen not to be a node (a dozen in a program).
_LEAVES: set[type] = {bytes, str, int, float, bool, type(None)}


def _flatten(value: Any, leaves: list[Any], is_leaf: IsLeaf | None) -> TreeDef:
    if type(value) in _LEAVES:  # a leaf whatever is_leaf says: nothing to descend into
        leaves.append(value)
        return LEAF
    if is_leaf is not None and is_leaf(value):
        leaves.append(value)
        return LEAF
    if isinstance(value, cabc.Mapping):
        keys = tuple(value)
        return ("dict", keys, tuple(_flatten(value[k], leaves, is_leaf) for k in keys))
    if isinstance(value, tuple):
        children = tuple(_flatten(v, leaves, is_leaf) for v in value)
        if hasattr(value, "_fields"):  # namedtuple: rebuilt with its own type
            return ("named", type(value), children)
        return ("tuple", None, children)
    if isinstance(value, list):
        if all(type(v) in _LEAVES for v in value):  # a batch of file bytes: no call per item
            leaves.extend(value)
            return ("list", None, (LEAF,) * len(value))
        return ("list", None, tuple(_flatten(v, leaves, is_leaf) for v in value))
    if len(_LEAVES) < 64:  # bounded: classes made on the fly must not grow it for ever
        _LEAVES.add(type(value))
    leaves.append(value)
    return LEAF


def unflatten(treedef: TreeDef, leaves: cabc.Iterable[Any]) -> Any:
    """The value of structure ``treedef`` with ``leaves`` in order."""
    it = iter(leaves)
    value = _unflatten(treedef, it)
    if next(it, _END) is not _END:
        raise ValueError("unflatten: more leaves than the structure holds")
    return value


_END = object()


def _unflatten(treedef: TreeDef, it: cabc.Iterator[Any]) -> Any:
    if treedef == LEAF:
        value = next(it, _END)
        if value is _END:
            raise ValueError("unflatten: fewer leaves than the structure holds")
        return value
    kind, key, children = treedef
    items = [_unflatten(c, it) for c in children]
    if kind == "dict":
        return dict(zip(key, items, strict=True))
    if kind == "named":
        return key(*items)
    if kind == "tuple":
        return tuple(items)
    return items


def count_leaves(treedef: TreeDef) -> int:
    if treedef == LEAF:
        return 1
    return sum(count_leaves(c) for c in treedef[2])


def map_leaves(value: Any, fn: Callable[[Any], Any], is_leaf: IsLeaf | None = None) -> Any:
    """``value`` with ``fn`` applied to every leaf (structure unchanged)."""
    treedef, leaves = flatten(value, is_leaf)
    return unflatten(treedef, [fn(leaf) for leaf in leaves])

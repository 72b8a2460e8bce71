"""The checks every part's settings share: each returns the value it was given, or raises
``ValueError``/``TypeError`` naming the argument and showing the value (``batch_size=0
must be a positive integer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

__all__ = ["callable_or_none", "flag", "non_negative_int", "positive_int"]


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer")
    return value


def flag(name: str, value: object) -> bool:
    """True or False, nothing else that is true or false."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False")
    return value


def callable_or_none(
    name: str, value: object, shape: str, say_none: bool = True
) -> Callable[..., Any] | None:
    """``value`` if it is callable or None; ``shape`` says what it maps (``bytes -> sample``),
    ``say_none`` whether the error says None would do (where None means "do nothing")."""
    if value is not None and not callable(value):
        raise TypeError(f"{name}={value!r} must be callable ({shape})" + (" or None" if say_none else ""))
    return cast("Callable[..., Any] | None", value)

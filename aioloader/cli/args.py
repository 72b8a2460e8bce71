"""argparse types shared by the ``aioloader`` subcommands: each returns the parsed value or
raises ``argparse.ArgumentTypeError`` with the text it was given."""

from __future__ import annotations

import argparse
from typing import Literal

__all__ = ["byte_size", "image_size", "int_or_auto", "loader_process", "positive_int"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


#: ``byte_size`` suffixes: powers of 1024.
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def byte_size(text: str) -> int:
    """A positive number of bytes: ``1000000``, or with a suffix K, M, G or T (powers of 1024,
    an optional ``B``/``iB`` after it): ``512M``, ``2GiB`` -> 2147483648."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _UNITS.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    try:
        value = int(float(number) * scale) if "." in number else int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes, e.g. 2G or 500000000") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of bytes")
    return value


def image_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` -> ``(width, height)``."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 500x375")
    width, height = int(parts[0]), int(parts[1])
    if width < 8 or height < 8:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be at least 8 pixels")
    return width, height


def int_or_auto(text: str) -> int | str:
    """``"auto"`` or a positive integer (an argparse type)."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer or 'auto'") from None


def loader_process(text: str) -> bool | Literal["auto"]:
    """``auto``, ``true`` or ``false`` -> ``Loader(loader_process=...)`` (an argparse type)."""
    choices: dict[str, bool | Literal["auto"]] = {"auto": "auto", "true": True, "false": False}
    try:
        return choices[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'auto', 'true' or 'false'") from None

"""The engine's asyncio helpers: tasks that fail together, tasks cancelled and awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ["cancel", "gather_or_cancel"]

T = TypeVar("T")


async def gather_or_cancel(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but the first failure cancels the others (and is raised)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:  # the first failure in batch order, so the error is deterministic
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        await cancel(tasks)


async def cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they are done (their own cleanup included)."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
    for t in tasks:  # mark results/exceptions as retrieved: no "never retrieved" warnings
        if t.done() and not t.cancelled():
            t.exception()

"""The two front-ends of one loader, behind one small driver, so a test is written once and
runs through both (the ``frontend`` fixture in conftest.py; like anyio's backend
parametrization).

``SyncDriver`` uses ``for``/``with``/``next``; ``AsyncDriver`` uses ``async for``/``async
with``/``anext``, every one of them awaited on one event loop that lives for the whole test
(an ``asyncio.Runner``), as a test body under ``pytest.mark.asyncio`` would. Only what a
front-end offers publicly is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from aioloader import Loader

T = TypeVar("T")


class SyncDriver:
    """``for``, ``with``, ``next``, ``close``."""

    name = "sync"
    #: What the iterator raises once the epoch is over.
    Stop: type[Exception] = StopIteration

    def opened(self, loader: Loader) -> AbstractContextManager[Loader]:
        """``with loader``."""
        return loader

    def start(self, loader: Loader) -> None:
        """The explicit start: ``loader.start()``."""
        loader.start()

    def close(self, loader: Loader) -> None:
        loader.close()

    def epoch(self, loader: Loader) -> list[Any]:
        """One whole ``for`` loop over the loader."""
        return list(loader)

    def take(self, loader: Loader, n: int) -> list[Any]:
        """A ``for`` loop that breaks after ``n`` batches (none started when ``n`` is 0):
        whatever is prefetched then is never consumed."""
        out: list[Any] = []
        if n == 0:
            return out
        for b in loader:
            out.append(b)
            if len(out) == n:
                break
        return out

    def for_each(self, loader: Loader, body: Callable[[Any], None]) -> None:
        """``for b in loader: body(b)``: the body runs inside the loop."""
        for b in loader:
            body(b)

    def iter(self, loader: Loader) -> Iterator[Any]:
        return iter(loader)

    def next(self, it: Any) -> Any:
        return next(it)

    def rest(self, it: Any) -> list[Any]:
        """Everything the iterator has left."""
        return list(it)

    def finish(self) -> None:
        pass


class AsyncDriver:
    """``async for``, ``async with``, ``anext``, ``aclose``, all on one event loop."""

    name = "async"
    Stop: type[Exception] = StopAsyncIteration

    def __init__(self) -> None:
        self._runner = asyncio.Runner()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    @contextmanager
    def opened(self, loader: Loader) -> Iterator[Loader]:
        """``async with loader`` (``__aenter__`` and ``__aexit__`` awaited on the loop)."""
        entered = self.run(loader.__aenter__())
        try:
            yield entered
        except BaseException as exc:
            if not self.run(loader.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.run(loader.__aexit__(None, None, None))

    def start(self, loader: Loader) -> None:
        """The explicit start: entering ``async with``."""
        self.run(loader.__aenter__())

    def close(self, loader: Loader) -> None:
        self.run(loader.aclose())

    def epoch(self, loader: Loader) -> list[Any]:
        async def collect() -> list[Any]:
            return [b async for b in loader]

        return self.run(collect())

    def take(self, loader: Loader, n: int) -> list[Any]:
        async def collect() -> list[Any]:
            out: list[Any] = []
            if n == 0:
                return out
            async for b in loader:
                out.append(b)
                if len(out) == n:
                    break
            return out

        return self.run(collect())

    def for_each(self, loader: Loader, body: Callable[[Any], None]) -> None:
        async def loop() -> None:
            async for b in loader:
                body(b)

        self.run(loop())

    def iter(self, loader: Loader) -> AsyncIterator[Any]:
        async def start() -> AsyncIterator[Any]:
            return aiter(loader)  # made on the running loop, as in async code

        return self.run(start())

    def next(self, it: Any) -> Any:
        async def step() -> Any:
            return await anext(it)

        return self.run(step())

    def rest(self, it: Any) -> list[Any]:
        async def collect() -> list[Any]:
            return [b async for b in it]

        return self.run(collect())

    def finish(self) -> None:
        """Close the loop (and its default executor); the fixture calls this after the test,
        before the leak check."""
        self._runner.close()


Driver = SyncDriver | AsyncDriver
FRONTENDS = ("sync", "async")


def make_driver(name: str) -> Driver:
    return SyncDriver() if name == "sync" else AsyncDriver()

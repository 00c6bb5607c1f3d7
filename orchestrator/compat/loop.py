"""One event loop in a daemon thread: CVS's synchronous calls run on it.

CVS's suites call `orch.exec(...)` from plain pytest functions, so the async
`Cluster` lives on a loop of its own for the orchestrator's whole life (its
connections stay open between calls). A daemon thread, so a suite that never
tears down cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "cvs-compat-loop") -> None:
        ready: queue.Queue[BlockingPortal | BaseException] = queue.Queue()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                ready.put(portal)
                await portal.sleep_until_stopped()

        def main() -> None:
            try:
                anyio.run(serve)
            except BaseException as exc:  # reported to the constructor, not lost
                ready.put(exc)

        self._thread = threading.Thread(target=main, name=name, daemon=True)
        self._thread.start()
        got = ready.get()
        if isinstance(got, BaseException):
            raise got
        self.portal: BlockingPortal = got

    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `func(*args)` on the loop and wait for its result."""
        return self.portal.call(func, *args)

    def enter(self, cm: Any) -> tuple[Any, AbstractContextManager[Any]]:
        """Enter an async context manager on the loop: (its value, a sync handle to exit it)."""
        wrapped = self.portal.wrap_async_context_manager(cm)
        return wrapped.__enter__(), wrapped

    def close(self) -> None:
        if self._thread.is_alive():
            self.portal.call(self.portal.stop)
            self._thread.join(timeout=10)

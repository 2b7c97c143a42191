"""Async twin of :func:`tests.polling.wait_for` for coroutine conditions (API calls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(condition: Callable[[], Awaitable[T | None]], timeout: float = 30.0,
                     what: str = "condition") -> T:
    """Await ``condition()`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = await condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)  # poll interval between checks of a real condition

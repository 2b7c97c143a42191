"""Waiting for a condition with a deadline: how tests synchronise with real processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Re-check ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)  # poll interval between checks of a real condition


class InBackground:
    """A blocking call made in a thread, so a test can act while it waits (start the database
    it waits for, the server it waits to reach): ``answers`` holds what it returned, or what
    it raised, once it is done."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.answers: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(call,))
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.answers.append(call())
        except Exception as exc:  # (shown by the caller's assertion)
            self.answers.append(exc)

    def join(self, timeout: float) -> list[Any]:
        self._thread.join(timeout=timeout)
        return self.answers

"""What every benchmark is: a name, a run that returns raw numbers, and a Markdown rendering.

One module per benchmark (``overhead.py``, ``scale.py``, ...), each a :class:`Benchmark`
subclass registered in :mod:`benchmarks`; the runner in ``__main__`` stores every run's raw
numbers in JSON and renders ``RESULTS.md`` from them, so the report never holds a figure that
was not measured.
"""

from __future__ import annotations

import abc
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunContext:
    """How a benchmark should run: full size or a quick smoke test, and where scratch goes."""

    quick: bool
    scratch: Path
    profile_dir: Path
    options: dict[str, Any] = field(default_factory=dict)

    def size(self, key: str, quick: int, full: int) -> int:
        """A workload size: ``--set key=N`` if given, else the quick or the full default."""
        value = self.options.get(key)
        return int(value) if value is not None else (quick if self.quick else full)

    def log(self, message: str) -> None:
        """Progress for the person watching; stderr so stdout stays clean."""
        print(f"[bench] {message}", file=sys.stderr, flush=True)


class NotMeasured(Exception):
    """Raised by :meth:`Benchmark.run` when its subject cannot be measured here (a part that
    has not landed, a service that does not start); the reason goes into ``RESULTS.md``."""


class Benchmark(abc.ABC):
    """One side-by-side measurement of tunehub and its peers."""

    name: str = "base"
    title: str = "base"
    @abc.abstractmethod
    def run(self, ctx: RunContext) -> dict[str, Any]:
        """Measure; return JSON-able raw numbers (the same dict :meth:`render` gets)."""

    @abc.abstractmethod
    def render(self, result: dict[str, Any]) -> str:
        """The Markdown section for ``RESULTS.md`` (without its heading)."""

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        """(target, what was measured, met?) rows for the summary on top of ``RESULTS.md``;
        ``None`` when there is no verdict to give."""
        return []

"""How long a trial forked from a warm process spent importing each package itself.

What a warm start saves is import time, so that is what is measured: every import of a module
not yet loaded goes through ``importlib._bootstrap._find_and_load`` (the interpreter looks it up
by name on each such import, and ``importlib.import_module`` calls it too), which the forked
trial wraps with a clock. Each import's time, less the time of the imports it made in turn, is
added to its top-level package, so ``from model import fit`` (the person's module) importing
``sklearn.tree`` charges scikit-learn, not ``model``. Imports of modules already loaded never
reach it and cost nothing more.

Why time and not a count of new modules: TensorFlow loads a handful of its own modules lazily on
first use (~1 ms), scikit-learn two empty data packages on ``load_digits()``; a missed preload
of ``sklearn.ensemble`` costs a second. Only packages over :data:`MIN_SECONDS` are reported.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from typing import Any

from tuner.backends.local import installed

#: Less import time than this in a package is no missed preload worth a note.
MIN_SECONDS = 0.05


class ImportClock:
    """Started in a forked trial before its code runs; :meth:`late` at its end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._frames = threading.local()  # per thread: the running imports' child time

    def start(self) -> bool:
        """Wrap the import machinery's loader entry point; False where this Python has none
        (nothing is measured then)."""
        bootstrap: Any = importlib._bootstrap
        original = getattr(bootstrap, "_find_and_load", None)
        if original is None:
            return False
        frames, seconds, clock = self._frames, self.seconds, time.perf_counter

        def timed(name: str, *args: Any) -> Any:
            stack: list[float] = frames.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time of the imports this one makes
            began = clock()
            try:
                return original(name, *args)
            finally:
                elapsed = clock() - began
                inner = stack.pop()
                if stack:
                    stack[-1] += elapsed
                top = name.partition(".")[0]
                seconds[top] = seconds.get(top, 0.0) + elapsed - inner

        bootstrap._find_and_load = timed
        return True

    def late(self) -> dict[str, float]:
        """Seconds per installed package (top-level name) of at least :data:`MIN_SECONDS`,
        most first: tunehub's own and the standard library left out."""
        found = {
            top: round(spent, 3) for top, spent in list(self.seconds.items())
            if spent >= MIN_SECONDS and top not in installed.PLATFORM
            and top not in sys.stdlib_module_names and installed.is_installed(top)
        }
        return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))

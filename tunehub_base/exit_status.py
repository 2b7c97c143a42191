"""How a process ended, as a person reads it in a trial's reason or a service's log line."""

from __future__ import annotations

import signal


def describe_exit(code: int) -> str:
    """A ``subprocess`` return code in words: a signal by name, SIGKILL with the likeliest
    sender (the kernel's out-of-memory killer)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"

"""English ordinals for places in a queue ("1st in queue"), shared by the hub's spawn page and
the tuner's waiting reasons so both say a place the same way."""

from __future__ import annotations


def ordinal(n: int) -> str:
    """1 -> ``1st``, 2 -> ``2nd``, 11 -> ``11th``, 23 -> ``23rd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

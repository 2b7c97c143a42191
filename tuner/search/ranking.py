"""Which of two metric values is better: one rule for the sweep's best trial (the ledger) and a
model version against production (the registry's ``if-better`` policy)."""

from __future__ import annotations


def is_better(value: float, than: float | None, direction: str) -> bool:
    """Whether ``value`` beats ``than`` for a metric to ``direction`` (``maximize`` or
    ``minimize``); anything beats no value at all. A tie is not better: the incumbent stays."""
    if than is None:
        return True
    return value > than if direction == "maximize" else value < than

"""Who is entitled to how much of the pool: weights and caps per person and per hub group.

Parsed from a plain dict (what a traitlet or a JSON environment variable gives)::

    {"default": {"weight": 1},
     "people": {"alice": {"weight": 2, "max_gpus": 4}},
     "groups": {"vision": {"weight": 3, "max_gpus": 8}}}

A request's *account* is the first of its person's hub groups that has an entry under
``groups`` (a team's quota is shared by the team), else the person; the fair policy orders
accounts by their dominant share, GPUs held / weight. Caps bound a person and each of their
configured groups at once. Everyone not named gets ``default`` (weight 1, no cap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunehub_base.pool.request import GpuRequest


@dataclass(frozen=True)
class Share:
    """One person's or group's weight (relative entitlement) and optional cap in GPUs."""

    weight: float = 1.0
    max_gpus: int | None = None


@dataclass(frozen=True)
class ShareConfig:
    """The weights and caps in force; see the module's docstring for the dict it reads."""

    default: Share = Share()
    people: Mapping[str, Share] = field(default_factory=dict)
    groups: Mapping[str, Share] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ShareConfig:
        """Read the configuration; a bad value is a ValueError naming its field."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError(f"pool shares: expected an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"default", "people", "groups"})
        if unknown:
            raise ValueError(f"pool shares: unknown field {unknown[0]!r} "
                             "(expected default, people, groups)")
        default = _read_share(data.get("default", {}), "default")
        return cls(
            default=default,
            people=_read_table(data.get("people", {}), "people"),
            groups=_read_table(data.get("groups", {}), "groups"),
        )

    def person(self, name: str) -> Share:
        return self.people.get(name, self.default)

    def account(self, request: GpuRequest) -> str:
        """Whose share a request counts against: its first configured group, else its person."""
        for group in request.groups:
            if group in self.groups:
                return f"group:{group}"
        return f"person:{request.person}"

    def weight(self, account: str) -> float:
        kind, _, name = account.partition(":")
        if kind == "group":
            return self.groups[name].weight
        return self.person(name).weight


def _read_table(table: Any, where: str) -> dict[str, Share]:
    if not isinstance(table, Mapping):
        raise ValueError(f"pool shares: {where} must be an object of names, "
                         f"got {type(table).__name__}")
    return {str(name): _read_share(entry, f"{where}.{name}") for name, entry in table.items()}


def _read_share(entry: Any, where: str) -> Share:
    if not isinstance(entry, Mapping):
        raise ValueError(f"pool shares: {where} must be an object with weight and max_gpus, "
                         f"got {type(entry).__name__}")
    unknown = sorted(set(entry) - {"weight", "max_gpus"})
    if unknown:
        raise ValueError(f"pool shares: unknown field {where}.{unknown[0]} "
                         "(expected weight, max_gpus)")
    weight = entry.get("weight", 1.0)
    if (isinstance(weight, bool) or not isinstance(weight, (int, float))
            or not math.isfinite(weight) or weight <= 0):
        raise ValueError(f"pool shares: {where}.weight must be a positive number, "
                         f"got {weight!r}")
    cap = entry.get("max_gpus")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise ValueError(f"pool shares: {where}.max_gpus must be a whole number >= 0 or null, "
                         f"got {cap!r}")
    return Share(weight=float(weight), max_gpus=cap)

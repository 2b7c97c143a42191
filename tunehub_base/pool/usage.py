"""Allocated GPU-seconds per person, hub group, sweep and notebook.

Counted when a holding ends (its GPUs × how long it held them), plus what running holdings
have used so far when a report is asked for; a preempted trial's time counts as used (it held
the GPUs) and its lost work is kept apart, so "used" and "lost to preemption" both add up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tunehub_base.pool.request import Holding


def _seconds() -> defaultdict[str, float]:
    return defaultdict(float)


@dataclass
class UsageReport:
    """GPU-seconds by who and what; ``lost_to_preemption`` by person."""

    person: defaultdict[str, float] = field(default_factory=_seconds)
    group: defaultdict[str, float] = field(default_factory=_seconds)
    sweep: defaultdict[str, float] = field(default_factory=_seconds)
    notebook: defaultdict[str, float] = field(default_factory=_seconds)
    lost_to_preemption: defaultdict[str, float] = field(default_factory=_seconds)

    def add(self, holding: Holding, gpu_seconds: float) -> None:
        request = holding.request
        self.person[request.person] += gpu_seconds
        for group in request.groups:
            self.group[group] += gpu_seconds
        if request.sweep_id is not None:
            self.sweep[request.sweep_id] += gpu_seconds
        else:
            self.notebook[request.request_id] += gpu_seconds

    @property
    def total(self) -> float:
        return sum(self.person.values())

    def with_running(self, holdings: Iterable[Holding], now: float) -> UsageReport:
        """A copy that also counts what ``holdings`` have used up to ``now``."""
        report = UsageReport(*(defaultdict(float, c) for c in (
            self.person, self.group, self.sweep, self.notebook, self.lost_to_preemption)))
        for holding in holdings:
            report.add(holding, len(holding.gpu_ids) * (now - holding.since))
        return report

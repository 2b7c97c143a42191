"""What the scheduler answers: starts, preemptions, a request's place in the queue, usage.

These are the values a caller acts on (start a notebook on these GPUs, SIGTERM that trial) and
shows people (position and reason on the spawn page, ``sweep show``, the Pool page).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunehub_base.pool.request import GpuRequest, Holding


@dataclass(frozen=True)
class Start:
    """Run ``holding.request`` now on ``holding.gpu_ids``."""

    holding: Holding


@dataclass(frozen=True)
class Preemption:
    """Stop ``victim`` (SIGTERM, then its grace period) so that ``beneficiary`` gets its GPUs;
    ``checkpoint_age`` is the work it loses if it saves nothing more before it exits."""

    victim: Holding
    beneficiary: GpuRequest
    checkpoint_age: float


Action = Start | Preemption


@dataclass(frozen=True)
class Decision:
    """The answer to one submit: started (``holding``), or waiting at ``position`` (1 = next)
    for ``reason``; ``actions`` is everything the pass decided (a preemption made for it)."""

    request: GpuRequest
    holding: Holding | None
    position: int | None
    reason: str
    actions: list[Action] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return self.holding is not None


@dataclass(frozen=True)
class QueueEntry:
    """A waiting request, its 1-based position and why it waits."""

    request: GpuRequest
    position: int
    reason: str


@dataclass(frozen=True)
class Released:
    """What a release did: the GPU-seconds the holding used; for a preempted trial, the work
    it lost (seconds since its last checkpoint) and the request put back in the queue."""

    holding: Holding
    gpu_seconds: float
    lost_seconds: float = 0.0
    requeued: GpuRequest | None = None

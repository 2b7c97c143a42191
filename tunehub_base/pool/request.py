"""What the pool schedules: a request for whole GPUs, and a holding of some.

A request says who asks (a person and their hub groups, whose shares and caps apply), what for
(an interactive notebook, or one trial of a sweep at the sweep's ``priority``) and how many GPUs.
A holding is a request that got its GPUs; for a trial it also remembers when the trial last
saved a checkpoint, because that is the work a preemption would throw away.

Both are plain values: the policies (:mod:`tunehub_base.pool.fair` and its siblings) order them,
the :class:`~tunehub_base.pool.scheduler.Scheduler` moves them between the queue and the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

#: A sweep's ``priority``, lowest first; the sweep spec reads its field from this tuple.
PRIORITIES = ("low", "normal", "high")

Kind = Literal["notebook", "trial"]

#: Ranks of the queue's tiers: every notebook outranks every trial; trials by priority.
NOTEBOOK_TIER = len(PRIORITIES)


@dataclass(frozen=True)
class GpuRequest:
    """One ask for ``gpus`` whole GPUs, from ``person`` (member of ``groups``)."""

    request_id: str
    person: str
    kind: Kind
    gpus: int
    enqueued_at: float
    groups: tuple[str, ...] = ()
    priority: str = "normal"
    sweep_id: str | None = None
    trial_number: int | None = None
    #: Times this request was preempted and put back in the queue (never a retry).
    preemptions: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("notebook", "trial"):
            raise ValueError(f"kind must be 'notebook' or 'trial', got {self.kind!r}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, "
                             f"got {self.priority!r}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {self.gpus}")
        if self.kind == "trial" and (self.sweep_id is None or self.trial_number is None):
            raise ValueError("a trial's request needs its sweep_id and trial_number")

    @property
    def tier(self) -> int:
        """Rank in the queue: notebooks above all trials, trials by their priority."""
        return NOTEBOOK_TIER if self.kind == "notebook" else PRIORITIES.index(self.priority)

    def requeued(self) -> GpuRequest:
        """The same trial back in the queue after a preemption: same sweep, trial number,
        parameters and place in line (its first enqueue time); one more preemption."""
        return replace(self, preemptions=self.preemptions + 1)


@dataclass
class Holding:
    """A request that holds ``gpu_ids`` since ``since``.

    ``last_checkpoint_at`` is when a trial last saved a checkpoint (its start until it saves
    one); ``stopping`` is set once the scheduler preempted it and it has not exited yet.
    """

    request: GpuRequest
    gpu_ids: tuple[str, ...]
    since: float
    last_checkpoint_at: float = field(default=0.0)
    stopping: bool = False

    def __post_init__(self) -> None:
        self.last_checkpoint_at = max(self.last_checkpoint_at, self.since)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def checkpoint_age(self, now: float) -> float:
        """Seconds of work since the last checkpoint: what stopping it now would lose."""
        return max(0.0, now - self.last_checkpoint_at)

"""What one person may ask of the platform: trials per sweep, a sweep's parallelism, and the
worker processes all their sweeps run at once.

Stated once, for every backend: :meth:`Limits.check` is called by
:meth:`tuner.sweep_store.SweepStore.submit` before the backend's own checks, so a spec over a cap
is refused (a 400 naming ``trials``, ``parallelism`` or ``resources.workers``) whether its trials
would run here or on Kubernetes; :meth:`Limits.admits` is asked by each sweep's controller
before it launches an attempt, so work beyond the per-person concurrency cap waits (pending) for
that person's own attempts to end instead of failing, while other people's go on starting. The
caps are settings of the options table (:mod:`tunehub_base.options`).

A cap bounds what one person can take from everyone else: an unbounded ``trials: 2147483647,
parallelism: 10000`` forked processes faster than anyone could cancel them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tunehub_base.options import setting
from tuner.spec import SpecError, SweepSpec

MAX_TRIALS = setting("TUNEHUB_MAX_TRIALS")
MAX_PARALLELISM = setting("TUNEHUB_MAX_PARALLELISM")
MAX_WORKERS_PER_PERSON = setting("TUNEHUB_MAX_WORKERS_PER_PERSON")


@dataclass(frozen=True)
class Limits:
    """The caps in force (each at least 1)."""

    max_trials: int = int(MAX_TRIALS.value or 0)
    max_parallelism: int = int(MAX_PARALLELISM.value or 0)
    max_workers_per_person: int = int(MAX_WORKERS_PER_PERSON.value or 0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The caps from the environment (the options table's variables), defaults where
        unset; a value that is not a positive whole number is a ValueError naming it."""
        values = []
        for s in (MAX_TRIALS, MAX_PARALLELISM, MAX_WORKERS_PER_PERSON):
            value = s.number(environ)
            if value < 1:
                raise ValueError(f"{s.env}: expected a whole number of at least 1, got {value}")
            values.append(value)
        return cls(*values)

    def check(self, spec: SweepSpec) -> None:
        """Refuse, at submission, a spec beyond a cap: named by its field, the cap and the
        setting that raises it."""
        workers = spec.resources.workers
        for name, asked, cap, source in (
            ("trials", spec.trials, self.max_trials, MAX_TRIALS),
            ("parallelism", spec.parallelism, self.max_parallelism, MAX_PARALLELISM),
            ("resources.workers", workers, self.max_workers_per_person, MAX_WORKERS_PER_PERSON),
        ):
            if asked > cap:
                raise SpecError(name, f"asks for {asked}, but the cap is {cap} ({source.env})")

    def waiting_reason(self, owner: str) -> str:
        """What a trial held back by its owner's concurrency cap says while it waits."""
        return (f"waiting: {owner}'s running attempts hold the {self.max_workers_per_person} "
                f"worker processes one person may run at once "
                f"({MAX_WORKERS_PER_PERSON.env}); it starts as one of them ends")

    def admits(self, running_workers: int, workers: int) -> bool:
        """Whether a person whose attempts run ``running_workers`` worker processes now may
        start one more attempt of ``workers``."""
        return running_workers + workers <= self.max_workers_per_person

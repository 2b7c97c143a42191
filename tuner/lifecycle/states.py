"""The lifecycle's vocabulary: sweep and trial states, what a backend says of an attempt, and
every state change allowed, in one table each.

States are :class:`~enum.StrEnum` members, so the database, the REST API and the JSON keep their
strings (``TrialState.COMPLETED == "completed"``) while the code names them as types. This is the
only module that spells a state: a test (``tests/test_states.py``) fails on a state string
anywhere else in ``tuner/`` or ``hub/``.

Not to be confused with Optuna's ``optuna.trial.TrialState`` (``COMPLETE``, ``PRUNED``,
``FAIL``, ``RUNNING``, ``WAITING``): that is the study's view, which has no "cancelled" and no
"pending"; :mod:`tuner.search.study` translates between the two, and modules that need both import
Optuna's as ``OptunaTrialState``.

Changes are made by :mod:`tuner.lifecycle.ledger`, which checks each against the tables below with
:func:`check_sweep` / :func:`check_trial`. This module imports nothing of tunehub's, so the
notebook client and the CLI can use it without the database or Optuna.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10 (pyproject's floor)

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are their strings, also in ``str()``."""

        def __str__(self) -> str:
            return str(self.value)


_L = TypeVar("_L", bound="_Lifecycle")


class _Lifecycle(StrEnum):
    """What sweep and trial states share: one rule for "finished". A state is finished when its
    transition table below has no way out of it, so the finished states and the table cannot
    disagree (``tests/test_states.py`` walks both)."""

    def is_finished(self) -> bool:
        """Ended for good: no change leaves it (nothing to resume, cancel or tell Optuna)."""
        return self in _FINISHED[type(self)]

    @classmethod
    def finished(cls: type[_L]) -> tuple[_L, ...]:
        return tuple(s for s in cls if s.is_finished())

    @classmethod
    def unfinished(cls: type[_L]) -> tuple[_L, ...]:
        """The sweeps a controller runs or will (resume); the trials a cancel ends."""
        return tuple(s for s in cls if not s.is_finished())


class SweepState(_Lifecycle):
    """A sweep's state. ``cancelling`` asks a running controller (maybe in another process) to
    stop; the controller then makes it ``cancelled``."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TrialState(_Lifecycle):
    """A trial's state (tunehub's, not Optuna's: see the module docstring). ``pending``: asked
    from Optuna and waiting for a slot, its first attempt or its next one."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_scored(self) -> bool:
        """Ended with a value that ranks it: completed, or pruned at a step."""
        return self in (TrialState.COMPLETED, TrialState.PRUNED)

    def counts_as_failure(self) -> bool:
        """Counts toward ``max_failed_trials`` (a cancelled trial is no failure)."""
        return self is TrialState.FAILED


class EventKind(StrEnum):
    """What a backend reports of one attempt (:class:`tuner.backends._base.TrialEvent`).
    ``waiting``: submitted but cannot start yet, its reason says why; not an outcome.
    ``preempted``: the GPU pool stopped it for a notebook (SIGTERM, a grace period, SIGKILL);
    an outcome, but not the trial's fault: see :data:`ATTEMPT_OUTCOMES`."""

    STARTED = "started"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"

    def is_final(self) -> bool:
        """An outcome, not news about a still-live attempt."""
        return self in ATTEMPT_OUTCOMES

    def uses_a_retry(self) -> bool:
        """Whether an attempt that ended so counts against the sweep's ``max_retries`` when
        the trial runs again: a failure does; a preemption never does (the trial goes back
        to the queue with its number and parameters, resumes from its checkpoint, and may be
        preempted any number of times)."""
        return ATTEMPT_OUTCOMES.get(self, False)


#: How an attempt can end, and whether running the trial again afterwards uses up one of its
#: ``max_retries`` (the one rule; :meth:`EventKind.uses_a_retry` reads it).
ATTEMPT_OUTCOMES: dict[EventKind, bool] = {
    EventKind.SUCCEEDED: False,
    EventKind.FAILED: True,
    EventKind.PREEMPTED: False,
}


#: The finished trial states a sweep keeps a counter of; its JSON view has one field each,
#: named by the state (``{"completed": 3, "pruned": 1, "failed": 0, ...}``).
COUNTED = (TrialState.COMPLETED, TrialState.PRUNED, TrialState.FAILED)


def counter_column(state: TrialState) -> str:
    """The sweep row's counter of trials that ended in ``state`` (one of :data:`COUNTED`):
    ``n_<state>``, e.g. ``n_completed``."""
    assert state in COUNTED, state
    return f"n_{state.value}"


def trials_done(sweep_view: Mapping[str, Any]) -> int:
    """How many of a sweep's trials ended with a count (a cancelled one is not counted)."""
    return sum(int(sweep_view[state]) for state in COUNTED)


#: The reason a preempted attempt's trial carries while it waits to run again.
PREEMPTED_REASON = ("preempted: its GPU went to a notebook or a higher-priority trial; it resumes "
                    "from its last checkpoint")

#: The reason a sweep cancelled by its owner carries (``sweep show``: "cancelled: cancelled").
CANCELLED_REASON = "cancelled"
#: The reason its unfinished trials carry; "sweep stopped" when it stopped itself on failures.
SWEEP_CANCELLED = "sweep cancelled"
SWEEP_STOPPED = "sweep stopped"


# --- the transitions ---------------------------------------------------------------------
# Every allowed change, once, with why it happens. A pair that is not here is a bug in tunehub
# (never the user's doing): the ledger raises IllegalTransition instead of writing it.

S, T = SweepState, TrialState

SWEEP_TRANSITIONS: dict[tuple[SweepState, SweepState], str] = {
    (S.QUEUED, S.RUNNING): "a controller claims the submitted sweep",
    (S.RUNNING, S.RUNNING): "a new controller claims a sweep whose controller died (resume)",
    (S.CANCELLING, S.CANCELLING): "claimed after a cancel was asked, or the cancel asked again",
    (S.QUEUED, S.CANCELLING): "cancel asked while a live controller is claiming it",
    (S.RUNNING, S.CANCELLING): "cancel asked of a live controller (maybe in another process)",
    (S.QUEUED, S.CANCELLED): "cancelled before any controller ran it (offline cancel)",
    (S.RUNNING, S.CANCELLED): "cancelled while its controller is dead (offline cancel)",
    (S.CANCELLING, S.CANCELLED): "its controller stopped it, or it was dead (offline cancel)",
    (S.RUNNING, S.COMPLETED): "every trial ended and at least one completed",
    (S.RUNNING, S.FAILED): "no trial completed, or max_failed_trials stopped it",
    (S.CANCELLING, S.COMPLETED): "it ended before its controller saw the cancel",
    (S.CANCELLING, S.FAILED): "it failed before its controller saw the cancel",
}

TRIAL_TRANSITIONS: dict[tuple[TrialState, TrialState], str] = {
    (T.PENDING, T.RUNNING): "an attempt is launched",
    (T.RUNNING, T.COMPLETED): "the attempt exited 0 after reporting a value",
    (T.RUNNING, T.PRUNED): "the pruner stopped it",
    (T.RUNNING, T.FAILED): "the attempt failed with no retry left",
    (T.RUNNING, T.PENDING): "retry after a failed attempt, rerun after its controller died, or "
                            "back to the queue after a preemption (not a retry)",
    (T.RUNNING, T.CANCELLED): "the sweep was cancelled or stopped while it ran",
    (T.PENDING, T.CANCELLED): "the sweep ended before it ran (asked ahead, or awaiting a retry)",
    # Recovery only: Optuna already holds an outcome our row lacks (a controller of an earlier
    # version told Optuna first and died before its own commit).
    (T.PENDING, T.COMPLETED): "recovery: Optuna recorded its result before our row did",
    (T.PENDING, T.PRUNED): "recovery: Optuna recorded it pruned before our row did",
    (T.PENDING, T.FAILED): "recovery: Optuna recorded it failed before our row did",
}

del S, T

#: Each kind's finished states: those no transition leaves (see :class:`_Lifecycle`).
_FINISHED: dict[type[_Lifecycle], frozenset[_Lifecycle]] = {
    kind: frozenset(kind) - {old for old, _ in table}
    for kind, table in ((SweepState, SWEEP_TRANSITIONS), (TrialState, TRIAL_TRANSITIONS))
}


class IllegalTransition(RuntimeError):
    """A state change no rule allows: a bug in tunehub, not a bad request (a 500, not a 4xx)."""

    def __init__(self, what: str, old: str, new: str) -> None:
        super().__init__(f"illegal {what} state change: {old} -> {new}")
        self.what, self.old, self.new = what, old, new


def check_sweep(old: str, new: SweepState) -> SweepState:
    """``new`` if a sweep may go from ``old`` to it; else :class:`IllegalTransition`."""
    if (SweepState(old), new) not in SWEEP_TRANSITIONS:
        raise IllegalTransition("sweep", old, new)
    return new


def check_trial(old: str, new: TrialState) -> TrialState:
    """``new`` if a trial may go from ``old`` to it; else :class:`IllegalTransition`."""
    if (TrialState(old), new) not in TRIAL_TRANSITIONS:
        raise IllegalTransition("trial", old, new)
    return new

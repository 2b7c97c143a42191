"""A backend whose trials run inside this process, as a script says, with no process at all.

Two users, one backend. The scale benchmark (``benchmarks/scale.py``) measures the controller's
own cost (ask, launch, tell) as a sweep grows to 10,000 trials: starting 10,000 real processes
would measure fork and the trial SDK instead. The controller's unit tests
(``tests/test_controller.py``) drive kill windows, retries, cancel races and trials asked ahead
deterministically, with no subprocess and no timing. Either way the controller's whole path
stays real (its database rows, working directories, log files, backend events, the report route
with its token check, Optuna's tell); only the process is replaced: each attempt's
:class:`Outcome` is played through the report callable it was bound to (the host's
:meth:`~tuner.scheduling.host.SweepHost.report`, the route the HTTP handler takes), then its
outcome event is emitted.

An attempt whose outcome is ``hold`` stays running until :meth:`InstantBackend.finish` (or a
cancel) ends it; held attempts also outlive an engine (like Kubernetes Jobs outlive their
controller), so a new engine's :meth:`~InstantBackend.reconcile` adopts them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.backends._base import Backend, TrialEvent, TrialLaunch
from tuner.lifecycle.states import CANCELLED_REASON, EventKind
from tuner.sdk.training import ENV_PARAMS, ENV_TOKEN


class Report(Protocol):
    """Where a trial's reports go: (trial id, token, attempt, value, step, last) -> prune?"""

    def __call__(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False,
    ) -> bool: ...


def quadratic(params: dict[str, Any]) -> float:
    """The benchmarks' trivial objective: a smooth bowl with its top at x=0.3, y=0.6."""
    return 1.0 - (float(params["x"]) - 0.3) ** 2 - (float(params["y"]) - 0.6) ** 2


@dataclass(frozen=True)
class Outcome:
    """What one attempt does: reports ``steps`` (values at steps 1, 2, …; it stops once told
    to prune), then reports ``value`` as its result if given, then exits: failed with
    ``fail`` as the reason if given, else 0. ``hold``: it starts and waits for
    :meth:`InstantBackend.finish`."""

    value: float | None = None
    steps: tuple[float, ...] = ()
    fail: str | None = None
    hold: bool = False
    last: bool = False  # the last of ``steps`` says so (as the Keras callback's last epoch)


#: What each attempt does, from its launch and its parameters.
Script = Callable[[TrialLaunch, dict[str, Any]], Outcome]


def quadratic_script(steps: int = 0) -> Script:
    """The benchmarks' trials: :func:`quadratic` as the result, after ``steps`` intermediate
    reports of it scaled by step/steps (the last one marked last), each judged by the sweep's
    pruner."""

    def script(launch: TrialLaunch, params: dict[str, Any]) -> Outcome:
        value = quadratic(params)
        return Outcome(value=value, steps=tuple(value * s / steps for s in range(1, steps + 1)),
                       last=True)

    return script


class InstantBackend(Backend):
    """Runs every attempt in this process; see the module docstring for why."""

    name = "instant"

    def __init__(self, steps: int = 0, script: Script | None = None) -> None:
        """``script``: what each attempt does; by default :func:`quadratic_script` with
        ``steps`` intermediate reports."""
        super().__init__()
        self.script = script or quadratic_script(steps)
        self.report: Report | None = None
        self.launches: list[TrialLaunch] = []
        self.cancels: list[tuple[int, int]] = []
        self.reconciled: list[set[tuple[int, int]]] = []  # what each reconcile adopted
        self.held: dict[tuple[int, int], TrialLaunch] = {}
        self._changed = asyncio.Event()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate`` holds, checking after each launch, hold and cancel (no
        timer: a test wakes exactly when the controller has acted)."""
        while not predicate():
            changed = self._changed
            await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def launched(self) -> int:
        return len(self.launches)

    def bind(self, report: Report) -> None:
        """Where the "trials" report (the host's report route, set once the host exists)."""
        self.report = report

    async def launch(self, launch: TrialLaunch) -> None:
        self.launches.append(launch)
        await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.STARTED))
        outcome = self.script(launch, json.loads(launch.env[ENV_PARAMS]))
        if outcome.hold:
            self.held[launch.key] = launch
        else:
            await self._play(launch, outcome)
        self._notify()

    async def finish(self, key: tuple[int, int], outcome: Outcome) -> None:
        """End the held attempt ``key`` (trial id, attempt) as ``outcome`` says."""
        await self._play(self.held.pop(key), outcome)

    async def cancel(self, trial_id: int, attempt: int) -> None:
        """A held attempt stops with a failed event; any other already ended."""
        self.cancels.append((trial_id, attempt))
        launch = self.held.pop((trial_id, attempt), None)
        if launch is not None:
            await self.emit(TrialEvent(trial_id, attempt, EventKind.FAILED, -15,
                                       CANCELLED_REASON))
        self._notify()

    async def reconcile(self, sweep_id: int, running: list[TrialLaunch]) -> set[tuple[int, int]]:
        """The held attempts among ``running`` are adopted (they kept running)."""
        adopted = {launch.key for launch in running if launch.key in self.held}
        self.reconciled.append(adopted)
        self._notify()
        return adopted

    def lose_all(self) -> None:
        """Every held attempt vanishes without a word (the machine they ran on died)."""
        self.held.clear()

    async def _play(self, launch: TrialLaunch, outcome: Outcome) -> None:
        assert self.report is not None, "bind() the report route first"
        token = launch.env[ENV_TOKEN]
        for step, value in enumerate(outcome.steps, start=1):
            last = outcome.last and step == len(outcome.steps)
            if self.report(launch.trial_id, token, launch.attempt, value, step, last):
                await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED,
                                           1, "told to prune"))
                return
        if outcome.value is not None:
            self.report(launch.trial_id, token, launch.attempt, outcome.value, None)
        if outcome.fail is not None:
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED, 1,
                                       outcome.fail))
        else:
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.SUCCEEDED, 0))

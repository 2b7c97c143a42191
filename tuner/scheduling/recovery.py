"""Picking up a sweep where a previous controller stopped (it died, or its process was asked to
stop): nothing finished is redone, nothing runs twice, no trial number is reused.

Run once by a new controller before it schedules anything. Between the previous controller's
last commit and its death any of these may have happened, and each is repaired here:

- a trial finished in our row but not told to Optuna: Optuna is told now;
- a trial asked from Optuna whose row was never written (death inside ``ask``): it becomes a
  pending trial, its missing parameters suggested now;
- a trial Optuna finished but our row did not (an earlier version told Optuna first): the row
  takes Optuna's outcome;
- attempts that were running: the backend is asked which still run. With a stable report
  address (the tuner service) those are adopted and keep running; the rest are rerun, once
  more regardless of ``max_retries`` (they did not fail by themselves).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import TrialState as OptunaTrialState

from tuner.backends._base import Backend, TrialLaunch
from tuner.db import Trial
from tuner.lifecycle.ledger import Counts, Ledger, tell_quietly
from tuner.lifecycle.states import TrialState
from tuner.lifecycle.trial_paths import TrialPaths
from tuner.scheduling.attempts import Running, RunningAttempts
from tuner.scheduling.objectives import objective_values
from tuner.search.mirror import StudyMirror
from tuner.search.study import our_state
from tuner.spec import SweepSpec

RESTARTED = "controller restarted"


@dataclass
class Recovered:
    """What the new controller starts from."""

    created: int  # trials asked from Optuna so far (the next ask gets this number)
    relaunch: deque[int]  # trial ids to launch before asking for new ones
    counts: Counts


@dataclass
class Recovery:
    """One sweep's recovery; :meth:`run` does it."""

    sweep_id: int
    spec: SweepSpec
    sweep_dir: Path
    study: StudyMirror
    ledger: Ledger
    backend: Backend
    running: RunningAttempts
    stable_api_url: bool

    async def run(self) -> Recovered:
        otrials = self.study.get_trials(deepcopy=False)
        by_number = {t.number: t for t in otrials}
        rows = self.ledger.trials(self.sweep_id)
        # Optuna writes through its own connection: everything it is told happens outside
        # any transaction of ours (SQLite has one writer: inside one, Optuna would wait on us).
        for row in rows:
            ot = by_number.get(row.number)
            if row.state.is_finished() and ot is not None and (
                ot.state == OptunaTrialState.RUNNING
            ):
                tell_quietly(self.study, row.number, row.state, row.value,
                             objective_values(self.spec, row.value, row.metrics))
        relaunch: deque[int] = deque()
        stale: list[Trial] = []
        for row in rows:
            if row.state.is_finished():
                continue
            ot = by_number.get(row.number)
            if ot is not None and ot.state.is_finished():
                self.ledger.adopt_outcome(row.id, our_state(ot.state),
                                          ot.values[0] if ot.values else None)
                continue
            if row.state == TrialState.RUNNING:
                stale.append(row)
            relaunch.append(row.id)
        relaunch.extend(self._adopt_orphans({row.number for row in rows}))
        self.ledger.set_reasons({row.id: RESTARTED for row in stale})
        counts = self.ledger.recount(self.sweep_id)
        if stale:
            kept = await self._reconcile(stale)
            for trial_id in kept:
                relaunch.remove(trial_id)
            self.ledger.requeue([row.id for row in stale if row.id not in kept], RESTARTED)
        return Recovered(created=len(otrials), relaunch=relaunch, counts=counts)

    def _adopt_orphans(self, known: set[int]) -> list[int]:
        """Trials asked from Optuna whose row was never written: pending rows now, with the
        parameters ``ask`` did not get to suggest."""
        ids = []
        for ot in self.study.get_trials(deepcopy=False):
            if ot.number in known or ot.state != OptunaTrialState.RUNNING:
                continue
            params = self.study.complete_params(ot.number, self.spec.distributions())
            ids.append(self.ledger.add_trial(
                self.sweep_id, ot.number, self.study.db_trial_id(ot.number), dict(params),
                TrialPaths.new(self.sweep_dir, ot.number),
            ))
        return ids

    async def _reconcile(self, stale: list[Trial]) -> set[int]:
        """Ask the backend which of the stale attempts still run; with a stable report
        address those are adopted (kept running, their progress kept). Returns their ids."""
        expected = [self._running_from(row) for row in stale
                    if self.stable_api_url and row.token_hash]
        # Expect the attempts before asking: the backend reports what it adopts at once.
        for rt in expected:
            self.running.add(rt)
        adopted = await self.backend.reconcile(self.sweep_id, [self._launch(r) for r in stale])
        kept = {rt.trial_id for rt in expected if rt.key in adopted}
        for rt in expected:
            if rt.trial_id not in kept:
                self.running.pop(rt.trial_id)
        self.ledger.set_reasons(dict.fromkeys(kept))
        return kept

    def _running_from(self, row: Trial) -> Running:
        """The controller's view of an attempt a previous controller launched."""
        assert row.token_hash is not None
        return Running(
            trial_id=row.id,
            number=row.number,
            attempt=row.attempts,
            token_hash=row.token_hash,
            optuna_trial=self.study.trial(row.number, row.optuna_trial_id),
            paths=TrialPaths.of(row),
            last_value=row.value,
            last_step=row.last_step,
            preemptions=row.preemptions or 0,
        )

    def _launch(self, row: Trial) -> TrialLaunch:
        """The launch record of a stale attempt, enough for the backend to find it."""
        return TrialLaunch(
            sweep_id=self.sweep_id,
            trial_id=row.id,
            number=row.number,
            attempt=row.attempts,
            command=self.spec.command,
            workdir=Path(row.workdir),
            env={},
            resources=self.spec.resources,
            timeout=self.spec.trial_timeout,
            log_path=Path(row.log_path or ""),
        )

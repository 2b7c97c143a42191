"""The sweep controller: asks Optuna for parameters, launches attempts, tells results.

Costs per trial are constant: the controller keeps counters and the running set in memory,
reacts to backend events (it never polls trials) and writes one row per event. Only a restart
reads the whole sweep once, to recover.

An :class:`Engine` hosts controllers in one process: the CLI hosts one sweep, the hub's tuner
service hosts all of them. Reports from trials reach the right controller through the engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import socket
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import TrialState
from sqlalchemy import select

from tuner import metrics
from tuner.backends._base import COLD, Backend, TrialEvent, TrialLaunch
from tuner.db import TRIAL_FINISHED, Database, Sweep, Trial, TrialReport, utcnow
from tuner.errors import Conflict, NotFound, TunehubError, Unauthorized
from tuner.mirror import MirroredTrial, StudyMirror, load_mirror
from tuner.settings import Settings
from tuner.spec import SweepSpec
from tuner.study import optuna_state, our_state
from tuner.sweeps import controller_alive, sweep_dir, tell_quietly
from tuner.trial import (
    ENV_API_URL,
    ENV_ARTIFACT_DIR,
    ENV_ATTEMPT,
    ENV_DATA,
    ENV_PARAMS,
    ENV_TOKEN,
    ENV_TRIAL_ID,
)

log = logging.getLogger("tunehub.controller")

HEARTBEAT_SECONDS = 5.0
WAKE_SECONDS = 1.0  # re-check free resources / cancellation when no event arrives


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Running:
    trial_id: int
    number: int
    attempt: int
    token_hash: str
    optuna_trial: MirroredTrial
    artifact_dir: Path
    last_value: float | None = None
    last_step: int | None = None
    final_value: float | None = None
    pruned: bool = False
    waiting: bool = False  # its reason says why it cannot start yet


class Engine:
    """Runs sweep controllers and routes backend events and trial reports to them."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        backends: dict[str, Backend],
        api_url: str,
        registry: object | None = None,
        stable_api_url: bool = False,
    ) -> None:
        """``stable_api_url``: trials can still report to ``api_url`` after this process
        restarts (the tuner service at a fixed address). A restarted controller then keeps
        the attempts its backend adopted (Kubernetes Jobs) instead of rerunning them; with a
        per-process address (the CLI) their reports would go nowhere, so they are rerun."""
        self.stable_api_url = stable_api_url
        self.db = db
        self.settings = settings
        self.backends = backends
        self.api_url = api_url.rstrip("/") + "/"
        self.registry = registry
        self.controllers: dict[int, SweepController] = {}
        self._by_trial: dict[int, SweepController] = {}
        self._tasks: dict[int, asyncio.Task[str]] = {}

    async def start(self) -> None:
        for backend in self.backends.values():
            backend.subscribe(self._route)
            await backend.start()

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for backend in self.backends.values():
            backend.unsubscribe(self._route)
            await backend.close()

    def run_sweep(self, sweep_id: int) -> asyncio.Task[str]:
        """Claim the sweep and drive it to the end in a task; the task's result is the
        sweep's final state."""
        if sweep_id in self._tasks and not self._tasks[sweep_id].done():
            return self._tasks[sweep_id]
        controller = SweepController(self, sweep_id)
        controller.claim()
        self.controllers[sweep_id] = controller
        task = asyncio.get_running_loop().create_task(controller.run(), name=f"sweep-{sweep_id}")
        self._tasks[sweep_id] = task

        def _done(_: asyncio.Task[str]) -> None:
            self.controllers.pop(sweep_id, None)
            self._tasks.pop(sweep_id, None)

        task.add_done_callback(_done)
        return task

    def cancel(self, sweep_id: int) -> bool:
        """Ask a sweep this engine runs to stop; False if it is not running here."""
        controller = self.controllers.get(sweep_id)
        if controller is None:
            return False
        controller.request_cancel()
        return True

    def report(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False,
    ) -> bool:
        """A trial's report; returns whether the trial should be pruned."""
        controller = self._by_trial.get(trial_id)
        if controller is None:
            raise NotFound(f"trial {trial_id} is not running")
        return controller.report(trial_id, token, attempt, value, step, last)

    def _track(self, trial_id: int, controller: SweepController | None) -> None:
        if controller is None:
            self._by_trial.pop(trial_id, None)
        else:
            self._by_trial[trial_id] = controller

    async def _route(self, event: TrialEvent) -> None:
        controller = self._by_trial.get(event.trial_id)
        if controller is not None:
            controller.events.put_nowait(event)


class SweepController:
    """Drives one sweep from its current state to completed or cancelled."""

    def __init__(self, engine: Engine, sweep_id: int) -> None:
        self.engine = engine
        self.db = engine.db
        self.sweep_id = sweep_id
        self.events: asyncio.Queue[TrialEvent | None] = asyncio.Queue()
        self.running: dict[int, _Running] = {}
        self.relaunch: deque[int] = deque()  # trial ids waiting for their next attempt
        self.ready: int | None = None  # a trial asked ahead, waiting for a free slot
        self.created = 0
        self.cancel_requested = False
        # Set when the sweep stops itself (too many failed trials): why, for the user.
        self.stop_reason: str | None = None
        self.n_failed = 0
        self.last_failure: str | None = None  # "trial N: reason" + its log's last lines
        self.cold_start: str | None = None
        with self.db.session() as s:
            sweep = s.get(Sweep, sweep_id)
            if sweep is None:
                raise NotFound(f"sweep {sweep_id} not found")
            self.owner = sweep.owner
            self.cold_start = sweep.cold_start
            self.name = sweep.name
            self.study_name = sweep.study_name
            self.code_dir = Path(sweep.code_dir) if sweep.code_dir else None
            self.spec = SweepSpec.from_dict(sweep.spec)
            self.backend = engine.backends.get(sweep.backend)
            if self.backend is None:
                raise Conflict(f"sweep {sweep_id} needs the {sweep.backend} backend")
        self.dir = sweep_dir(engine.settings, sweep_id)
        # The study in memory, kept in step with the database's: asks and should_prune never
        # read the sweep's history back from the database (tuner.mirror). Loaded by run(),
        # off the event loop.
        self.study: StudyMirror

    # --- ownership -----------------------------------------------------------------------

    def claim(self) -> None:
        """Become the sweep's controller, unless a live one already is."""
        with self.db.session() as s:
            sweep = s.get(Sweep, self.sweep_id, with_for_update=True)
            assert sweep is not None
            if sweep.state in ("completed", "failed", "cancelled"):
                raise Conflict(f"sweep {self.sweep_id} is {sweep.state}; nothing to resume")
            mine = sweep.controller_pid == os.getpid() and (
                sweep.controller_host == socket.gethostname()
            )
            if not mine and controller_alive(sweep):
                raise Conflict(
                    f"sweep {self.sweep_id} is being run by process {sweep.controller_pid} "
                    f"on {sweep.controller_host}"
                )
            sweep.controller_host = socket.gethostname()
            sweep.controller_pid = os.getpid()
            sweep.heartbeat_at = utcnow()
            if sweep.state == "cancelling":
                self.cancel_requested = True
            else:
                sweep.state = "running"
            sweep.started_at = sweep.started_at or utcnow()

    def request_cancel(self) -> None:
        self.cancel_requested = True
        self.events.put_nowait(None)  # wake the loop

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> str:
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat())
        try:
            # Reading a resumed sweep's whole study takes a while (about a second at 10,000
            # trials): in a thread, so the engine's other sweeps and the report API go on.
            self.study = await asyncio.to_thread(
                load_mirror, self.spec, self.study_name, self.db.url)
            await self._recover()
            while True:
                if self.cancel_requested or self.stop_reason is not None:
                    await self._cancel_running()
                    break
                await self._fill()
                if (not self.running and not self.relaunch and self.ready is None
                        and self.created >= self.spec.trials):
                    break
                try:
                    event = await asyncio.wait_for(self.events.get(), timeout=WAKE_SECONDS)
                except asyncio.TimeoutError:
                    continue
                if event is not None:
                    await self._handle(event)
        except asyncio.CancelledError:
            # The engine is shutting down: leave the sweep claimable by the next controller.
            await self._release()
            raise
        finally:
            heartbeat.cancel()
        return await self._finish()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)  # a periodic timer, not synchronisation
            with self.db.session() as s:
                sweep = s.get(Sweep, self.sweep_id)
                if sweep is None:
                    return
                sweep.heartbeat_at = utcnow()
                if sweep.state == "cancelling" and not self.cancel_requested:
                    self.request_cancel()

    async def _start_ready(self) -> None:
        """Start the trial asked ahead in the slot that just freed, before the bookkeeping of
        the trial that freed it: the slot idles for a launch, not for a database round."""
        if (self.ready is not None and not self.cancel_requested
                and len(self.running) < self.spec.parallelism
                and self.backend.can_launch(self.spec.resources)):
            trial_id, self.ready = self.ready, None
            await self._launch(trial_id)

    async def _fill(self) -> None:
        while len(self.running) < self.spec.parallelism and not self.cancel_requested:
            if not self.relaunch and self.ready is None and self.created >= self.spec.trials:
                return
            if not self.backend.can_launch(self.spec.resources):
                return
            if self.relaunch:
                trial_id = self.relaunch.popleft()
            elif self.ready is not None:
                trial_id, self.ready = self.ready, None
            else:
                trial_id = self._ask()
            await self._launch(trial_id)
        # Every slot busy: ask for the next trial now, while they run, so the slot the next
        # finished trial frees starts at once instead of waiting for the sampler (the trial is
        # a pending row: cancel cancels it, resume launches it).
        if (len(self.running) >= self.spec.parallelism and self.ready is None
                and not self.relaunch and not self.cancel_requested
                and self.created < self.spec.trials):
            self.ready = self._ask()

    def _ask(self) -> int:
        otrial = self.study.ask(self.spec.distributions())
        self.created += 1
        with self.db.session() as s:
            row = self._new_row(otrial.number, otrial.trial_id, otrial.params)
            s.add(row)
            s.flush()
            return row.id

    def _new_row(self, number: int, optuna_trial_id: int, params: dict[str, Any]) -> Trial:
        """A pending trial with its own working directory under the sweep's."""
        workdir = self.dir / "trials" / str(number)
        return Trial(
            sweep_id=self.sweep_id,
            number=number,
            optuna_trial_id=optuna_trial_id,
            state="pending",
            params=params,
            workdir=str(workdir),
            log_path=str(workdir / "trial.log"),
            artifact_dir=str(workdir / "artifacts"),
        )

    async def _launch(self, trial_id: int) -> None:
        token = secrets.token_urlsafe(32)
        with self.db.session() as s:
            row = s.get(Trial, trial_id)
            assert row is not None
            row.attempts += 1
            row.state = "running"
            row.token_hash = hash_token(token)
            row.started_at = utcnow()
            attempt, number, params = row.attempts, row.number, dict(row.params)
            workdir, log_path = Path(row.workdir), Path(row.log_path or "")
            artifact_dir = Path(row.artifact_dir or workdir / "artifacts")
            optuna_trial_id, reason = row.optuna_trial_id, row.reason
            sweep = s.get(Sweep, self.sweep_id)
            assert sweep is not None
            sweep.n_started += 1 if attempt == 1 else 0
        self._prepare_workdir(workdir, artifact_dir)
        with open(log_path, "a") as fh:
            why = f" (after: {reason})" if attempt > 1 and reason else ""
            fh.write(f"=== tunehub: trial {number}, attempt {attempt}{why} ===\n")
        env = dict(self.spec.env)
        env.update(
            {
                ENV_API_URL: self.engine.api_url,
                ENV_TRIAL_ID: str(trial_id),
                ENV_ATTEMPT: str(attempt),
                ENV_TOKEN: token,
                ENV_PARAMS: _json(params),
                ENV_ARTIFACT_DIR: str(artifact_dir),
                ENV_DATA: str(self.engine.settings.data),
                "TUNEHUB_SWEEP_ID": str(self.sweep_id),
                "TUNEHUB_TRIAL_NUMBER": str(number),
            }
        )
        self.running[trial_id] = _Running(
            trial_id=trial_id,
            number=number,
            attempt=attempt,
            token_hash=hash_token(token),
            optuna_trial=self.study.trial(number, optuna_trial_id),
            artifact_dir=artifact_dir,
        )
        self.engine._track(trial_id, self)
        metrics.TRIALS_LAUNCHED.inc()
        metrics.TRIALS_RUNNING.inc()
        await self.backend.launch(
            TrialLaunch(
                sweep_id=self.sweep_id,
                trial_id=trial_id,
                number=number,
                attempt=attempt,
                command=self.spec.command,
                workdir=workdir,
                env=env,
                resources=self.spec.resources,
                timeout=self.spec.trial_timeout,
                log_path=log_path,
                priority=self.spec.priority,
                owner=self.owner,
                sweep_name=self.name,
                preload=self.spec.preload,
            )
        )

    def _prepare_workdir(self, workdir: Path, artifact_dir: Path) -> None:
        """The trial's own directory, with the sweep's code snapshot linked in so
        ``python train.py`` works and outputs stay per trial."""
        fresh = not workdir.exists()
        workdir.mkdir(parents=True, exist_ok=True)
        artifact_dir.mkdir(parents=True, exist_ok=True)
        if fresh and self.code_dir is not None and self.code_dir.is_dir():
            for entry in self.code_dir.iterdir():
                link = workdir / entry.name
                if not link.exists():
                    link.symlink_to(entry)

    # --- reports and events --------------------------------------------------------------

    def report(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False,
    ) -> bool:
        rt = self.running.get(trial_id)
        if rt is None or not secrets.compare_digest(hash_token(token), rt.token_hash):
            raise Unauthorized("this token is not valid for that trial")
        if attempt != rt.attempt:
            raise Unauthorized(f"attempt {attempt} of this trial is no longer running")
        if step is None:
            rt.final_value = value
            return False
        with self.db.session() as s:
            existing = s.scalar(
                select(TrialReport).where(
                    TrialReport.trial_id == trial_id, TrialReport.step == step
                )
            )
            if existing is None:
                s.add(TrialReport(trial_id=trial_id, step=step, value=value))
            else:
                existing.value = value
            row = s.get(Trial, trial_id)
            assert row is not None
            row.value, row.last_step = value, step
        rt.last_value, rt.last_step = value, step
        metrics.REPORTS.inc()
        rt.optuna_trial.report(value, step)
        if not last and rt.optuna_trial.should_prune():
            rt.pruned = True
        return rt.pruned

    async def _handle(self, event: TrialEvent) -> None:
        rt = self.running.get(event.trial_id)
        if rt is None or event.attempt != rt.attempt:
            return  # an old attempt's late news
        if not event.final:
            if event.kind == "started":
                self._note_start(event.reason)
            self._waiting(rt, event)
            return
        del self.running[event.trial_id]
        self.engine._track(event.trial_id, None)
        metrics.TRIALS_RUNNING.dec()
        await self._start_ready()
        value = rt.final_value if rt.final_value is not None else rt.last_value
        if rt.pruned:
            self._finish_trial(rt, "pruned", rt.last_value, f"pruned at step {rt.last_step}")
        elif event.kind == "succeeded" and value is not None:
            self._finish_trial(rt, "completed", value, None)
        else:
            if event.kind == "succeeded":
                reason = f"exited 0 without reporting {self.spec.metric} (call tuner.report)"
            else:
                reason = event.reason or "failed"
            if rt.attempt <= self.spec.max_retries and not self.cancel_requested:
                with self.db.session() as s:
                    row = s.get(Trial, rt.trial_id)
                    assert row is not None
                    row.state, row.reason = "pending", reason
                    row.token_hash = None
                self.relaunch.append(rt.trial_id)
            else:
                self._finish_trial(rt, "failed", None, reason)
                self._check_failures(rt, reason)

    def _note_start(self, how: str) -> None:
        """A cold start is shown on the sweep (``sweep show``, the API) with its reason,
        once: it makes every trial seconds slower, and nothing else would say so."""
        cold = how if how.startswith(COLD) else None
        if cold != self.cold_start:
            self.cold_start = cold
            with self.db.session() as s:
                sweep = s.get(Sweep, self.sweep_id)
                if sweep is not None:
                    sweep.cold_start = cold

    def _check_failures(self, rt: _Running, reason: str) -> None:
        """Keep the last failure's cause for the user, and stop the sweep once
        ``max_failed_trials`` trials have failed: a broken spec or script fails every trial
        the same way, and running the rest only hides the cause under a count."""
        with self.db.session() as s:
            row = s.get(Trial, rt.trial_id)
            log_path = Path(row.log_path) if row is not None and row.log_path else None
        tail = log_tail(log_path) if log_path is not None else ""
        self.last_failure = f"trial {rt.number}: {reason}" + (f"\n{tail}" if tail else "")
        limit = self.spec.failure_limit()
        if limit is not None and self.n_failed >= limit and self.stop_reason is None:
            self.stop_reason = (
                f"stopped after {self.n_failed} failed trials (max_failed_trials: {limit}); "
                f"last failure, {self.last_failure}"
            )

    def _waiting(self, rt: _Running, event: TrialEvent) -> None:
        """A running trial that cannot start yet shows why in its reason (``sweep show``, the
        API) until it starts."""
        if event.kind == "waiting":
            reason: str | None = event.reason
        elif rt.waiting:  # started: the wait is over
            reason = None
        else:
            return
        rt.waiting = reason is not None
        with self.db.session() as s:
            row = s.get(Trial, rt.trial_id)
            assert row is not None
            row.reason = reason

    def _finish_trial(
        self, rt: _Running, state: str, value: float | None, reason: str | None
    ) -> None:
        has_model = (rt.artifact_dir / "model" / "saved_model.pb").exists()
        with self.db.session() as s:
            row = s.get(Trial, rt.trial_id)
            sweep = s.get(Sweep, self.sweep_id)
            assert row is not None and sweep is not None
            row.state, row.reason, row.finished_at = state, reason, utcnow()
            row.has_model = has_model
            row.token_hash = None  # the attempt's token dies with it
            if value is not None:
                row.value = value
            if state == "completed":
                sweep.n_completed += 1
                if value is not None and self._better(value, sweep.best_value):
                    sweep.best_value, sweep.best_trial_number = value, rt.number
            elif state == "pruned":
                sweep.n_pruned += 1
            elif state == "failed":  # a cancelled trial is no failure
                sweep.n_failed += 1
            self.n_failed = sweep.n_failed
        metrics.TRIALS_FINISHED.labels(state).inc()
        tell_quietly(self.study, rt.number, optuna_state(state), value)

    def _better(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        return value > best if self.spec.direction == "maximize" else value < best

    # --- recovery, cancel, end -----------------------------------------------------------

    async def _recover(self) -> None:
        """Pick up where a previous controller stopped: nothing finished is redone, nothing
        running twice, no trial number reused."""
        otrials = self.study.get_trials(deepcopy=False)
        self.created = len(otrials)
        by_number = {t.number: t for t in otrials}
        with self.db.session() as s:
            known = {number: (state, value) for number, state, value in s.execute(
                select(Trial.number, Trial.state, Trial.value)
                .where(Trial.sweep_id == self.sweep_id)
            )}
        # Optuna writes through its own connection, so everything it is told happens outside
        # our write transaction (SQLite has one writer: inside it, Optuna would wait on us).
        # Finished on our side but not told (the controller died in between): tell it now.
        for number, (state, value) in known.items():
            ot = by_number.get(number)
            if state in TRIAL_FINISHED and ot is not None and ot.state == TrialState.RUNNING:
                tell_quietly(self.study, number, optuna_state(state), value)
        # Asked from Optuna but the row was never written (the controller died inside ask):
        # adopt it as a pending trial with its parameters completed.
        orphans = {
            ot.number: self.study.complete_params(ot.number, self.spec.distributions())
            for ot in otrials
            if ot.number not in known and ot.state == TrialState.RUNNING
        }
        with self.db.session() as s:
            rows = list(s.scalars(select(Trial).where(Trial.sweep_id == self.sweep_id)))
            for ot in otrials:
                if ot.number in orphans:
                    row = self._new_row(ot.number, self.study.db_trial_id(ot.number),
                                        orphans[ot.number])
                    s.add(row)
                    rows.append(row)
            s.flush()
            stale: list[TrialLaunch] = []
            expected: list[_Running] = []
            for row in rows:
                ot = by_number.get(row.number)
                if row.state in TRIAL_FINISHED:
                    continue
                if ot is not None and ot.state.is_finished():
                    row.state = our_state(ot.state)
                    row.value = ot.value if ot.value is not None else row.value
                    row.finished_at = row.finished_at or utcnow()
                    continue
                if row.state == "running":
                    stale.append(self._launch_record(row))
                    row.reason = "controller restarted"
                    if self.engine.stable_api_url and row.token_hash:
                        expected.append(self._running_from(row))
                self.relaunch.append(row.id)
            self._recount(s)
        if stale:
            # Expect the attempts before asking: the backend reports what it adopts at once.
            for rt in expected:
                self.running[rt.trial_id] = rt
                self.engine._track(rt.trial_id, self)
            adopted = await self.backend.reconcile(self.sweep_id, stale)
            self._keep_adopted(expected, adopted)

    def _running_from(self, row: Trial) -> _Running:
        """The controller's view of an attempt a previous controller launched."""
        assert row.token_hash is not None
        return _Running(
            trial_id=row.id,
            number=row.number,
            attempt=row.attempts,
            token_hash=row.token_hash,
            optuna_trial=self.study.trial(row.number, row.optuna_trial_id),
            artifact_dir=Path(row.artifact_dir or Path(row.workdir) / "artifacts"),
            last_value=row.value,
            last_step=row.last_step,
        )

    def _keep_adopted(self, expected: list[_Running], adopted: set[tuple[int, int]]) -> None:
        """Adopted attempts keep running (no rerun, their progress kept); the rest are rerun."""
        kept = [rt for rt in expected if (rt.trial_id, rt.attempt) in adopted]
        for rt in expected:
            if rt not in kept:
                del self.running[rt.trial_id]
                self.engine._track(rt.trial_id, None)
        if not kept:
            return
        with self.db.session() as s:
            for rt in kept:
                self.relaunch.remove(rt.trial_id)
                row = s.get(Trial, rt.trial_id)
                assert row is not None
                row.reason = None
                metrics.TRIALS_RUNNING.inc()

    def _launch_record(self, row: Trial) -> TrialLaunch:
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

    def _recount(self, s: object) -> None:
        from sqlalchemy import func
        from sqlalchemy.orm import Session

        assert isinstance(s, Session)
        counts = dict(
            s.execute(
                select(Trial.state, func.count())
                .where(Trial.sweep_id == self.sweep_id)
                .group_by(Trial.state)
            ).all()
        )
        sweep = s.get(Sweep, self.sweep_id)
        assert sweep is not None
        sweep.n_completed = counts.get("completed", 0)
        sweep.n_pruned = counts.get("pruned", 0)
        sweep.n_failed = counts.get("failed", 0)
        self.n_failed = sweep.n_failed

    async def _cancel_running(self) -> None:
        why = "sweep cancelled" if self.stop_reason is None else "sweep stopped"
        running = list(self.running.values())
        for rt in running:
            await self.backend.cancel(rt.trial_id, rt.attempt)
        # Wait for the backend to confirm each one stopped.
        while self.running:
            event = await self.events.get()
            if event is None:
                continue
            rt = self.running.get(event.trial_id)
            if rt is not None and event.attempt == rt.attempt and event.final:
                del self.running[event.trial_id]
                self.engine._track(event.trial_id, None)
                metrics.TRIALS_RUNNING.dec()
                self._finish_trial(rt, "cancelled", None, why)
        self.relaunch.clear()

    async def _finish(self) -> str:
        with self.db.session() as s:
            pending = s.scalars(
                select(Trial).where(
                    Trial.sweep_id == self.sweep_id, Trial.state.in_(("pending", "running"))
                )
            )
            cancelled = []
            why = "sweep cancelled" if self.stop_reason is None else "sweep stopped"
            for row in pending:
                row.state, row.reason, row.finished_at = "cancelled", why, utcnow()
                cancelled.append(row.number)
            sweep = s.get(Sweep, self.sweep_id)
            assert sweep is not None
            if self.cancel_requested:
                sweep.state, sweep.reason = "cancelled", "cancelled"
            elif self.stop_reason is not None:
                sweep.state, sweep.reason = "failed", self.stop_reason
            elif sweep.n_completed == 0:
                sweep.state, sweep.reason = "failed", "no trial completed" + (
                    f"; last failure, {self.last_failure}" if self.last_failure else ""
                )
            else:
                sweep.state, sweep.reason = "completed", None
            sweep.finished_at = utcnow()
            sweep.controller_pid = None
            state = sweep.state
        # After our commit: Optuna writes through its own connection (SQLite has one writer).
        for number in cancelled:
            tell_quietly(self.study, number, TrialState.FAIL)
        if state == "completed" and self.spec.promote is not None:
            self._register_best()
        await self.backend.cleanup(self.sweep_id)
        metrics.SWEEPS_FINISHED.labels(state).inc()
        log.info("sweep %s %s", self.sweep_id, state)
        return state

    def _register_best(self) -> None:
        """The best completed trial with a saved model becomes a model version; the
        promotion policy decides whether it goes to production."""
        from tuner.registry import Registry

        assert self.spec.promote is not None
        order = Trial.value.desc() if self.spec.direction == "maximize" else Trial.value.asc()
        with self.db.session() as s:
            best = s.scalar(
                select(Trial)
                .where(
                    Trial.sweep_id == self.sweep_id,
                    Trial.state == "completed",
                    Trial.has_model.is_(True),
                )
                .order_by(order)
                .limit(1)
            )
        if best is None:
            self._note("no completed trial saved a model (tuner.save_model); nothing registered")
            return
        registry = self.engine.registry or Registry(
            self.db, self.engine.settings.registry, self.engine.settings.serving_root)
        try:
            version = self._register(registry, best, self.spec.promote.model)
        except TunehubError as exc:  # e.g. the model name was taken while the sweep ran
            self._note(f"model not registered: {exc}")
            return
        self._promote(registry, version, self.spec.promote.policy)

    def _register(self, registry: Any, best: Trial, model: str) -> Any:
        return registry.register(
            model=model,
            source_dir=Path(best.artifact_dir or "") / "model",
            owner=self.owner,
            metric=self.spec.metric,
            direction=self.spec.direction,
            metric_value=best.value,
            sweep_id=self.sweep_id,
            trial_number=best.number,
            params=dict(best.params),
            code_location=str(self.code_dir) if self.code_dir else None,
            data_path=str(self.engine.settings.data),
        )

    def _promote(self, registry: Any, version: Any, policy: str) -> None:
        promoted, why = registry.apply_policy(version, policy)
        with self.db.session() as s:
            sweep = s.get(Sweep, self.sweep_id)
            assert sweep is not None
            sweep.model_version_id = version.id
            sweep.reason = (
                f"{version.model} v{version.version} "
                + ("promoted to production" if promoted else "registered, not promoted")
                + (f": {why}" if why else "")
            )

    def _note(self, message: str) -> None:
        with self.db.session() as s:
            sweep = s.get(Sweep, self.sweep_id)
            assert sweep is not None
            sweep.reason = message

    async def _release(self) -> None:
        with self.db.session() as s:
            sweep = s.get(Sweep, self.sweep_id)
            if sweep is not None and sweep.controller_pid == os.getpid():
                sweep.controller_pid = None


LOG_TAIL_LINES = 8
LOG_TAIL_BYTES = 16_384


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines a trial printed (tunehub's own header lines left out): usually the
    traceback that says why it failed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("=== tunehub:")]
    return "\n".join(kept[-lines:])


def _json(value: object) -> str:
    import json

    return json.dumps(value)

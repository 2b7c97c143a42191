"""The sweep controller schedules: it decides when to ask Optuna for a trial, when to launch an
attempt, and what a backend event or a report means for the trial; everything else it hands to
one module each (rows and states: :mod:`tuner.lifecycle.ledger`; recovery:
:mod:`tuner.scheduling.recovery`; files: :mod:`tuner.scheduling.workdirs`; tokens and
environment: :mod:`tuner.scheduling.trial_env`; the model at the end:
:mod:`tuner.scheduling.promotion`).

What it keeps is in memory (the running attempts, the counters, the study's mirror): it reacts
to backend events and never polls trials, and each event costs a database transaction or two
whatever the sweep's size. The sampler and the pruner see a bounded view of the study once
it is large (:mod:`tuner.search.sampling_view`), so their cost stops growing with it too. Only a
restart reads the whole sweep, once, to recover.

The event loop is kept for what is on a running trial's path (its launch, its reports, its
exit): the sampler's ask and a finished trial's ledger write and tell run in worker threads,
the study's lock (:class:`~tuner.search.mirror.StudyMirror`) keeping them apart. With trials of a
fraction of a second, each of these blocked the loop for 10-25 ms, and the other trials'
reports and exits queued behind them.

A :class:`~tuner.scheduling.host.SweepHost` hosts controllers and routes reports and events to
them; the controller knows its host only as :class:`ControllerHost`. Code outside the package
watches a controller's steps through :class:`ControllerObserver` (the benchmarks time them so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tunehub_base.gpu_meter import UseMeter, UsePolicy
from tunehub_base.gpu_pod_use import PodUseBook
from tunehub_base.gpu_usage import GpuReading
from tunehub_base.options import setting
from tunehub_base.settings import Settings
from tuner import metrics, untrusted_files
from tuner.backends._base import (
    COLD,
    NOT_WARM,
    Backend,
    TrialEvent,
    TrialLaunch,
    not_fully_warm,
)
from tuner.db import Database
from tuner.db.outage import off_the_loop_while_down, waiting_out_outages
from tuner.errors import Conflict, Unauthorized
from tuner.lifecycle.ledger import Counts, Ledger
from tuner.lifecycle.liveness import HEARTBEAT_SECONDS
from tuner.lifecycle.states import (
    CANCELLED_REASON,
    SWEEP_CANCELLED,
    SWEEP_STOPPED,
    EventKind,
    SweepState,
    TrialState,
)
from tuner.lifecycle.trial_paths import TrialPaths
from tuner.limits import Limits
from tuner.scheduling.attempts import Running, RunningAttempts
from tuner.scheduling.objectives import BadReport, check_final_report, objective_values
from tuner.scheduling.promotion import SweepOrigin, register_best
from tuner.scheduling.recovery import Recovery
from tuner.scheduling.report_writer import ReportRow
from tuner.scheduling.trial_env import AttemptIdentity, new_token, token_matches, trial_env
from tuner.scheduling.workdirs import log_tail, prepare_workdir, write_attempt_header
from tuner.search.mirror import MirroredTrial, StudyMirror, load_mirror
from tuner.serving.measuring import Candidate
from tuner.spec import SweepSpec
from tuner.sweep_store import sweep_dir

if TYPE_CHECKING:
    from tuner.serving.registry import Registry

__all__ = ["ControllerHost", "ControllerObserver", "SweepController"]

log = logging.getLogger("tunehub.controller")

WAKE_SECONDS = 1.0  # re-check free resources / cancellation when no event arrives
MAX_POD_GPUS = 16  # GPUs one attempt's pod may report
MAX_NOTED_IMPORTS = 20  # packages named in a sweep's "not fully warm" note


class ControllerObserver:
    """Watches a controller's steps from outside, the way Ray Tune's ``Callback`` watches its
    trials: subclass it, override what you need, and add it to the host's ``observers``.
    Each hook gets the sweep, the trial and how long the step took (``seconds``, a
    ``time.perf_counter`` difference); it runs where the step ran (``on_trial_asked`` in the
    worker thread of the ask, the others on the event loop) and must be quick. An observer
    that raises stops the sweep like a bug in the controller would: it is not caught."""

    def on_trial_asked(self, sweep_id: int, trial_id: int, seconds: float) -> None:
        """The sampler gave a new trial; its pending row and directory exist."""

    def on_trial_start(
        self, sweep_id: int, trial_id: int, attempt: int, launched_at: float, seconds: float
    ) -> None:
        """An attempt of the trial was handed to the backend: ``launched_at`` is the wall-clock
        moment (``time.time()``) the controller began launching it."""

    def on_report(
        self, sweep_id: int, trial_id: int, step: int | None, value: float, pruned: bool,
        seconds: float,
    ) -> None:
        """A report of a running attempt was judged (``pruned``: the answer it got)."""

    def on_trial_end(
        self, sweep_id: int, trial_id: int, state: TrialState, value: float | None,
        seconds: float,
    ) -> None:
        """The trial's end was written by the ledger and told to Optuna."""


@dataclass(frozen=True)
class TakenReport:
    """A report a controller judged: its answer, and what is left to write before that
    answer is given (``row``; None for a final report, which the attempt's end records)."""

    sweep_id: int
    pruned: bool
    row: ReportRow | None = None
    mirrored: MirroredTrial | None = None

    def written(self) -> None:
        """The row is committed: Optuna's study holds the step now."""
        if self.row is not None and self.row.optuna_trial_id is not None and self.mirrored:
            self.mirrored.written(self.row.step)


class ControllerHost(Protocol):
    """What a controller needs of the process that hosts it
    (:class:`~tuner.scheduling.host.SweepHost`)."""

    db: Database
    ledger: Ledger
    settings: Settings
    backends: dict[str, Backend]
    api_url: str
    replica_url: str
    stable_api_url: bool
    registry: Registry | None
    observers: list[ControllerObserver]

    def track(self, trial_id: int, controller: SweepController) -> None: ...

    def untrack(self, trial_id: int) -> None: ...

    def admits(self, owner: str, workers: int) -> bool: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def pool_gate(self) -> PoolGate | None: ...


class PoolGate(Protocol):
    """The GPU pool's say over a trial's start (the tuner service's
    :class:`~tuner.scheduling.gpu_queue.GpuQueue`): the policy's order, caps and preemptions."""

    def admits(self, controller: SweepController) -> tuple[bool, str | None]:
        """``(True, None)``: start the next trial now; else ``(False, reason)``, ``reason``
        what the waiting trial's row says (None: leave it)."""
        ...


class SweepController:
    """Drives one sweep from its current state to completed, failed or cancelled."""

    def __init__(self, engine: ControllerHost, sweep_id: int) -> None:
        self.engine = engine
        self.ledger = engine.ledger
        self.sweep_id = sweep_id
        self.events: asyncio.Queue[TrialEvent | None] = asyncio.Queue()
        self.running = RunningAttempts(
            on_add=lambda trial_id: engine.track(trial_id, self), on_remove=engine.untrack)
        self.relaunch: deque[int] = deque()  # trial ids waiting for their next attempt
        self.ready: int | None = None  # a trial asked ahead, waiting for a free slot
        self.owner_queued: int | None = None  # the ready trial, told it waits for its owner's cap
        #: The waiting trial told why the GPU pool holds it back, and what it was told.
        self.pool_queued: tuple[int, str] | None = None
        # The ask ahead while it runs in a worker thread: its trial id once done.
        self.asking: asyncio.Future[int] | None = None
        self.created = 0
        #: Trial numbers of the trials this controller asked or launched, by trial id (the
        #: GPU pool's queue names waiting trials by number).
        self.numbers: dict[int, int] = {}
        self.cancel_requested = False
        # Set when the sweep stops itself (too many failed trials): why, for the user.
        self.stop_reason: str | None = None
        self.counts = Counts()
        self.last_failure: str | None = None  # "trial N: reason" + its log's last lines
        sweep = self.ledger.sweep(sweep_id)
        self.owner = sweep.owner
        self.cold_start = sweep.cold_start
        # What warm trials imported themselves after their start, in the order first seen.
        self.late_imports: dict[str, None] = {}
        self.name = sweep.name
        self.code_dir = Path(sweep.code_dir) if sweep.code_dir else None
        self.spec = SweepSpec.from_dict(sweep.spec)
        backend = engine.backends.get(sweep.backend)
        if backend is None:
            raise Conflict(f"sweep {sweep_id} needs the {sweep.backend} backend")
        self.backend = backend
        self.dir = sweep_dir(engine.settings, sweep_id)
        self.study_name = sweep.study_name
        # The study in memory, kept in step with the database's: asks and should_prune never
        # read the sweep's history back from the database (tuner.search.mirror). Loaded by run(),
        # off the event loop.
        self.study: StudyMirror

    # --- ownership -----------------------------------------------------------------------

    def claim(self) -> None:
        """Become the sweep's controller, unless a live one already is."""
        if self.ledger.claim(self.sweep_id, self.engine.replica_url) == SweepState.CANCELLING:
            self.cancel_requested = True

    def cancel(self) -> None:
        """Stop the sweep: its attempts are cancelled and it ends ``cancelled``."""
        self.cancel_requested = True
        self.wake()

    def wake(self) -> None:
        """Have the loop look again at once (a slot may be free), not at its next tick."""
        self.events.put_nowait(None)

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> SweepState:
        # A controller waits out a database outage (tuner.db.outage): its ledger calls, its
        # heartbeat and its worker threads retry with backoff, its running trials go on,
        # and their reports wait for it (the SDK retries a 503).
        with waiting_out_outages():
            return await self._run()

    async def _run(self) -> SweepState:
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat())
        try:
            # Reading a resumed sweep's whole study takes a while (about a second at 10,000
            # trials): in a thread, so the engine's other sweeps and the report API go on.
            self.study = await asyncio.to_thread(
                load_mirror, self.spec, self.study_name, self.engine.db.url)
            await self._recover()
            while True:
                if self.cancel_requested or self.stop_reason is not None:
                    await self.asked_ahead()
                    await self._cancel_running()
                    break
                await self._fill()
                if self._done():
                    break
                event = await self._next_event()
                if event is not None:
                    await self._handle(event)
        except asyncio.CancelledError:
            # The engine is shutting down: leave the sweep claimable by the next controller,
            # once an ask ahead has written its row (whoever ends the sweep next must see it).
            try:
                await self.asked_ahead()
            except Exception:  # its trial, if created in Optuna, is recovered by the next one
                log.exception("sweep %s: the ask ahead failed during shutdown", self.sweep_id)
            self.ledger.release(self.sweep_id)
            raise
        finally:
            heartbeat.cancel()
        return await self._finish()

    async def _next_event(self) -> TrialEvent | None:
        """The next backend event; None after ``WAKE_SECONDS`` without one, or on a wake-up.

        Not ``asyncio.wait_for``: on Python 3.11 it swallows the task's cancellation when an
        event arrives in the same moment, and the engine's close then waits forever. A
        cancelled ``Queue.get`` leaves its item in the queue, so nothing is lost here."""
        getter = asyncio.ensure_future(self.events.get())
        try:
            done, _ = await asyncio.wait({getter}, timeout=WAKE_SECONDS)
        finally:
            if not getter.done():
                getter.cancel()
        return getter.result() if done else None

    def _done(self) -> bool:
        return (not self.running and not self.relaunch and self.ready is None
                and self.asking is None and self.created >= self.spec.trials)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)  # a periodic timer, not synchronisation
            state = await off_the_loop_while_down(self.ledger.heartbeat, self.sweep_id)
            if state is None:
                return
            if state == SweepState.CANCELLING and not self.cancel_requested:
                self.cancel()

    async def _recover(self) -> None:
        recovered = await Recovery(
            self.sweep_id, self.spec, self.dir, self.study, self.ledger, self.backend,
            self.running, self.engine.stable_api_url,
        ).run()
        self.created, self.relaunch, self.counts = (
            recovered.created, recovered.relaunch, recovered.counts)

    # --- scheduling ----------------------------------------------------------------------

    def _slot_free(self) -> bool:
        return (len(self.running) < self.spec.parallelism and not self.cancel_requested
                and self._can_launch())

    def _can_launch(self) -> bool:
        """An attempt may start now: within its owner's cap on concurrent workers (all their
        sweeps on this host together; :mod:`tuner.limits`) and the backend has room (GPUs).
        Otherwise the trial waits, pending, and the loop looks again on the next event."""
        return self._owner_admits() and self._room()

    def _owner_admits(self) -> bool:
        return self.engine.admits(self.owner, self.spec.resources.workers)

    def _room(self) -> bool:
        """The GPU pool's policy lets the next trial start (where a pool decides: the tuner
        service's local GPUs), and the backend has room for it."""
        gate = self.engine.pool_gate
        if gate is not None:
            admitted, reason = gate.admits(self)
            if not admitted:
                self._queue_for_pool(reason)
                return False
        return self.backend.can_launch(self.spec.resources)

    def _queue_for_pool(self, reason: str | None) -> None:
        """Held back by the pool: a trial waits as a pending row (asked ahead now if need
        be, so the queue names it), saying ``reason`` where the pool gives one (a cap)."""
        if self.ready is None and not self.relaunch:
            self._ask_ahead()
            return
        trial_id = self.relaunch[0] if self.relaunch else self.ready
        if reason is None or trial_id is None or self.pool_queued == (trial_id, reason):
            return
        self.pool_queued = (trial_id, reason)
        self.ledger.set_reasons({trial_id: reason})

    async def _queue_behind_owner(self) -> None:
        """Over its owner's cap: the next trial waits as a pending row that says why (asked
        ahead now if need be), until one of the owner's attempts ends and the host wakes us.
        The reason's write waits out a database outage in a worker thread, not on the loop."""
        if self.ready is None:
            self._ask_ahead()
        elif self.ready != self.owner_queued:
            self.owner_queued = self.ready
            await off_the_loop_while_down(
                self.ledger.set_reasons,
                {self.ready: self.engine.limits.waiting_reason(self.owner)})

    async def _start_ready(self) -> None:
        """Start the trial asked ahead in the slot that just freed, before the bookkeeping of
        the trial that freed it: the slot idles for a launch, not for a database round."""
        self._take_asked()
        if self.ready is not None and self._slot_free():
            trial_id, self.ready = self.ready, None
            await self._launch(trial_id)

    async def _fill(self) -> None:
        self._take_asked()
        while len(self.running) < self.spec.parallelism and not self.cancel_requested:
            if not self.relaunch and self.ready is None and (
                    self.asking is not None or self.created >= self.spec.trials):
                return  # (a trial being asked takes the slot once ready: it wakes the loop)
            if not self._owner_admits():
                await self._queue_behind_owner()
                return
            if not self._room():
                return
            if self.relaunch:
                trial_id = self.relaunch.popleft()
            elif self.ready is not None:
                trial_id, self.ready = self.ready, None
            else:
                self.created += 1
                trial_id = await asyncio.to_thread(self._ask)
                if not self._can_launch():
                    # While it was asked, another sweep of the owner took the last slot under
                    # their cap: the trial waits, asked, for the next one.
                    self.ready = trial_id
                    return
            await self._launch(trial_id)
        # Every slot busy: ask for the next trial now, while they run, so the slot the next
        # finished trial frees starts at once instead of waiting for the sampler (the trial is
        # a pending row: cancel cancels it, resume launches it). The sampler and the inserts
        # run in a worker thread: the event loop goes on serving the running trials' reports
        # and exits meanwhile, and the finished ask wakes the loop.
        if len(self.running) >= self.spec.parallelism:
            self._ask_ahead()

    def _ask_ahead(self) -> None:
        """Ask for the next trial in a worker thread, unless one is asked or waiting already
        or none is left; it wakes the loop when done."""
        if (self.ready is None and self.asking is None and not self.relaunch
                and not self.cancel_requested and self.created < self.spec.trials):
            self.created += 1
            self.asking = asyncio.ensure_future(asyncio.to_thread(self._ask))
            self.asking.add_done_callback(lambda _: self.events.put_nowait(None))

    def _take_asked(self) -> None:
        """The ask ahead, once its thread is done, becomes the ready trial (its error, if it
        failed, is raised here)."""
        if self.asking is not None and self.asking.done():
            asking, self.asking = self.asking, None
            self.ready = asking.result()

    async def asked_ahead(self) -> None:
        """Wait for an ask ahead still in its thread: its trial is a row the sweep's end (or
        the next controller) must see, not one written after it."""
        if self.asking is not None:
            await asyncio.wait({self.asking})
            self._take_asked()

    def _ask(self) -> int:
        """A new trial from the sampler, with its pending row and its directory (made while
        it waits, not when its slot frees); runs in a worker thread (the study's lock keeps
        the loop's reports and tells out of it meanwhile)."""
        began = time.perf_counter()
        asked = self.study.ask(self.spec.distributions())
        paths = TrialPaths.new(self.dir, asked.number)
        trial_id = self.ledger.add_trial(self.sweep_id, asked.number, asked.trial_id,
                                         asked.params, paths)
        self.numbers[trial_id] = asked.number
        prepare_workdir(paths, self.code_dir)
        for observer in self.engine.observers:
            observer.on_trial_asked(self.sweep_id, trial_id, time.perf_counter() - began)
        return trial_id

    async def _launch(self, trial_id: int) -> None:
        launched_at, began = time.time(), time.perf_counter()
        token, token_hash = new_token()
        start = await off_the_loop_while_down(self.ledger.start_attempt, self.sweep_id,
                                              trial_id, token_hash)
        self.numbers[trial_id] = start.number
        if trial_id == self.owner_queued or (self.pool_queued or (None,))[0] == trial_id:
            self.owner_queued = None  # its wait is over
            self.pool_queued = None
            await off_the_loop_while_down(self.ledger.set_reasons, {trial_id: None})
        prepare_workdir(start.paths, self.code_dir)
        write_attempt_header(start.paths.log_path, start.number, start.attempt,
                             start.previous_reason)
        who = AttemptIdentity(self.sweep_id, trial_id, start.number, start.attempt, token,
                              self.engine.api_url)
        env = trial_env(self.spec.env, who, start.params, start.paths.artifact_dir,
                        self.engine.settings.data, start.paths.checkpoint_dir)
        metrics.TRIALS_LAUNCHED.inc()
        self.running.add(Running(
            trial_id=trial_id,
            number=start.number,
            attempt=start.attempt,
            token_hash=token_hash,
            optuna_trial=self.study.trial(start.number, start.optuna_trial_id),
            paths=start.paths,
            preemptions=start.preemptions,
        ))
        await self.backend.launch(TrialLaunch(
            sweep_id=self.sweep_id,
            trial_id=trial_id,
            number=start.number,
            attempt=start.attempt,
            command=self.spec.command,
            workdir=start.paths.workdir,
            env=env,
            resources=self.spec.resources,
            timeout=self.spec.trial_timeout,
            log_path=start.paths.log_path,
            priority=self.spec.priority,
            owner=self.owner,
            sweep_name=self.name,
            preload=self.spec.preload,
        ))
        for observer in self.engine.observers:
            observer.on_trial_start(self.sweep_id, trial_id, start.attempt, launched_at,
                                    time.perf_counter() - began)

    # --- reports and events --------------------------------------------------------------

    def take_report(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False, metrics: dict[str, float] | None = None,
    ) -> TakenReport:
        """A running attempt's report, judged: whether the trial should be pruned, and the row
        its caller writes (:mod:`tuner.scheduling.report_writer`) before it answers."""
        rt = self._attempt(trial_id, token, attempt)
        if metrics is not None:
            if step is not None:
                raise BadReport("metrics", "several metrics are a final report: no step")
            value = check_final_report(self.spec, metrics)
            rt.final_metrics = dict(metrics)
        elif step is None and self.spec.multi_objective:
            check_final_report(self.spec, {self.spec.metric: value})
        if step is None:
            rt.final_value = value
            return TakenReport(self.sweep_id, pruned=False)
        rt.last_value, rt.last_step = value, step
        if self.spec.multi_objective:
            # Kept for the charts; Optuna neither takes nor prunes it.
            return TakenReport(self.sweep_id, False, ReportRow(trial_id, step, value))
        mirrored = rt.optuna_trial
        optuna_id = mirrored.trial_id if mirrored.report(value, step) else None
        if not last and mirrored.should_prune():
            rt.pruned = True
        return TakenReport(self.sweep_id, rt.pruned,
                           ReportRow(trial_id, step, value, optuna_id), mirrored)

    def _attempt(self, trial_id: int, token: str, attempt: int) -> Running:
        """The running attempt this token was made for, or Unauthorized."""
        rt = self.running.get(trial_id)
        if rt is None or not token_matches(token, rt.token_hash):
            raise Unauthorized("this token is not valid for that trial")
        if attempt != rt.attempt:
            raise Unauthorized(f"attempt {attempt} of this trial is no longer running")
        return rt

    def gpu_use(self, trial_id: int, token: str, attempt: int,
                readings: list[GpuReading]) -> dict[str, Any]:
        """A pod's reading of its own GPUs: summed per GPU for the attempt and kept with the
        sweep (:class:`~tunehub_base.gpu_pod_use.PodUseBook`), so ``sweep show`` and the
        Sweeps page flag a trial that holds a GPU it does not use."""
        rt = self._attempt(trial_id, token, attempt)
        policy = UsePolicy.from_env()
        now = time.time()
        book = PodUseBook(self.engine.settings.gpu_locks_dir)
        for reading in readings:
            meter = rt.gpu_meters.get(reading.gpu)
            if meter is None:
                if len(rt.gpu_meters) >= MAX_POD_GPUS:
                    continue
                meter = rt.gpu_meters[reading.gpu] = UseMeter(reading.gpu, since=now)
            meter.add(reading, now, policy)
            book.keep(self.sweep_id, {"trial": rt.number, "attempt": rt.attempt,
                                      "gpu": reading.gpu, "start": meter.since, "end": now,
                                      "use": meter.to_json(policy)})
        return {"unused": sorted(g for g, m in rt.gpu_meters.items() if m.unused(policy))}

    async def _handle(self, event: TrialEvent) -> None:
        rt = self.running.current(event.trial_id, event.attempt)
        if rt is None:
            return  # an old attempt's late news
        if not event.final:
            if event.kind == EventKind.STARTED:
                await self._note_start(event.reason)
            await self._waiting(rt, event)
            return
        self.running.pop(event.trial_id)
        note_unused_pod_gpus(rt)
        await self._note_warmth(event)
        await self._start_ready()
        if event.kind == EventKind.PREEMPTED and not rt.pruned and not self.cancel_requested:
            # Back to the queue, first in this sweep's line: same number and parameters, its
            # checkpoint kept; not failed, and not a retry (Running.retries_used).
            await off_the_loop_while_down(self.ledger.requeue, [rt.trial_id], event.reason,
                                          preempted=True)
            self.relaunch.appendleft(rt.trial_id)
            metrics.TRIALS_PREEMPTED.inc()
            return
        state, value, reason = self._outcome(rt, event)
        if state != TrialState.FAILED or reason is None:  # (a failure always has a reason)
            await self._finish_trial(rt, state, value, reason)
        elif rt.retries_used <= self.spec.max_retries and not self.cancel_requested:
            # retried: pending again
            await off_the_loop_while_down(self.ledger.requeue, [rt.trial_id], reason)
            self.relaunch.append(rt.trial_id)
        else:
            await self._finish_trial(rt, state, None, reason)
            self._check_failures(rt, reason)

    def _outcome(
        self, rt: Running, event: TrialEvent
    ) -> tuple[TrialState, float | None, str | None]:
        """What an attempt's final event makes of its trial: (state, value, reason)."""
        value = rt.final_value if rt.final_value is not None else rt.last_value
        if rt.pruned:
            return TrialState.PRUNED, rt.last_value, f"pruned at step {rt.last_step}"
        if event.kind == EventKind.SUCCEEDED and value is not None:
            return TrialState.COMPLETED, value, None
        if event.kind == EventKind.SUCCEEDED:
            return TrialState.FAILED, None, (
                f"exited 0 without reporting {self.spec.metric} (call tuner.report)")
        return TrialState.FAILED, None, event.reason or str(event.kind)

    async def _note_start(self, how: str) -> None:
        """A cold start is shown on the sweep (``sweep show``, the API) with its reason,
        once: it makes every trial seconds slower, and nothing else would say so. A warm
        start does not clear a note that trials were not fully warm (:meth:`_note_warmth`):
        the next one pays the same imports."""
        cold = how if how.startswith(COLD) else None
        if cold is None and (self.cold_start or "").startswith(NOT_WARM):
            return
        if cold != self.cold_start:
            self.cold_start = cold
            await off_the_loop_while_down(self.ledger.note_cold_start, self.sweep_id, cold)

    async def _note_warmth(self, event: TrialEvent) -> None:
        """A warm-started trial that imported packages itself after its start makes the
        sweep's note say so, naming them (all named so far); a cold start's note stays."""
        late = event.imported_after_start
        if not late or (self.cold_start or "").startswith(COLD):
            return
        self.late_imports.update(dict.fromkeys(late))
        note = not_fully_warm(list(self.late_imports)[:MAX_NOTED_IMPORTS])
        if note != self.cold_start:
            self.cold_start = note
            await off_the_loop_while_down(self.ledger.note_cold_start, self.sweep_id, note)

    def _check_failures(self, rt: Running, reason: str) -> None:
        """Keep the last failure's cause for the user, and stop the sweep once
        ``max_failed_trials`` trials have failed: a broken spec or script fails every trial
        the same way, and running the rest only hides the cause under a count."""
        tail = log_tail(rt.paths.log_path)
        self.last_failure = f"trial {rt.number}: {reason}" + (f"\n{tail}" if tail else "")
        limit = self.spec.failure_limit()
        failed = self.counts.failed
        if limit is not None and failed >= limit and self.stop_reason is None:
            self.stop_reason = (
                f"stopped after {failed} failed trials (max_failed_trials: {limit}); "
                f"last failure, {self.last_failure}"
            )

    async def preempt(self, trial_id: int, attempt: int) -> bool:
        """Stop a running attempt for the GPU pool (a notebook needs its GPUs): the backend
        sends SIGTERM, and after the grace period SIGKILL; its ``preempted`` event then puts
        the trial back in the queue (:meth:`_handle`). False when that attempt is not running
        (it ended meanwhile) or the backend cannot preempt."""
        rt = self.running.current(trial_id, attempt)
        if rt is None:
            return False
        if rt.preempting:
            return True
        rt.preempting = await self.backend.preempt(trial_id, attempt)
        return rt.preempting

    def waiting_for_gpus(self) -> list[int]:
        """Trial ids that would start now if GPUs were free, in the order this sweep starts
        them: those put back in the queue (preempted, or a retry), then the one asked ahead;
        as many as it has free slots (the others wait for its ``parallelism``, not the pool).
        Empty when its trials need no GPU."""
        free = self.spec.parallelism - len(self.running)
        if not self.spec.resources.gpu or self.cancel_requested or free <= 0:
            return []
        waiting = list(self.relaunch)
        if self.ready is not None:
            waiting.append(self.ready)
        return waiting[:free]

    async def _waiting(self, rt: Running, event: TrialEvent) -> None:
        """A running trial that cannot start yet shows why in its reason (``sweep show``, the
        API) until it starts."""
        if event.kind == EventKind.WAITING:
            reason: str | None = event.reason
        elif rt.waiting:  # started: the wait is over
            reason = None
        else:
            return
        rt.waiting = reason is not None
        await off_the_loop_while_down(self.ledger.set_reasons, {rt.trial_id: reason})

    async def _finish_trial(
        self, rt: Running, state: TrialState, value: float | None, reason: str | None
    ) -> None:
        """The ledger's transaction and Optuna's tell, in a worker thread: the event loop goes
        on serving the other trials' reports and exits meanwhile (the next trial has already
        started in the freed slot). A shutdown waits for the thread: the controller lets go
        of the sweep only after what it began is written and told."""
        def finish() -> Counts:
            now, why, figures, values = self._figures(rt, state, value, reason)
            return self.ledger.finish_trial(
                self.sweep_id, rt.trial_id, now, value, why,
                has_model=rt.paths.has_model(), direction=self.spec.direction, teller=self.study,
                figures=figures, values=values,
            )

        began = time.perf_counter()
        self.numbers.pop(rt.trial_id, None)
        job = asyncio.ensure_future(asyncio.to_thread(finish))
        try:
            self.counts = await asyncio.shield(job)
        except asyncio.CancelledError:
            await asyncio.wait({job})
            raise
        for observer in self.engine.observers:
            observer.on_trial_end(self.sweep_id, rt.trial_id, state, value,
                                  time.perf_counter() - began)

    def _figures(
        self, rt: Running, state: TrialState, value: float | None, reason: str | None,
    ) -> tuple[TrialState, str | None, dict[str, float] | None, list[float] | None]:
        """A finishing trial's metrics: what it reported, and, when the sweep uses them, the
        serving figures of its model measured now (:mod:`tuner.serving.cost`; seconds, in
        the finishing thread). A multi-objective trial missing one of its values fails with
        the reason."""
        figures = dict(rt.final_metrics or {})
        if state != TrialState.COMPLETED:
            return state, reason, figures or None, None
        if self.spec.serving_figures() and rt.paths.has_model():
            from tuner.serving.cost import CostError
            from tuner.serving.intake import ModelRefused

            try:
                figures.update(self.backend.measurer().measure(self._candidate(rt)))
            except (CostError, ModelRefused, OSError) as exc:
                reason = f"serving cost not measured: {exc}"
        values = objective_values(self.spec, value, figures)
        if self.spec.multi_objective and values is None:
            missing = [o.name for o in self.spec.objectives
                       if o.name not in figures and o.name != self.spec.metric]
            why = reason or ("no model to measure (call tuner.save_model)"
                             if not rt.paths.has_model() else "not measured")
            return TrialState.FAILED, f"{', '.join(missing)} missing: {why}", figures, None
        return state, reason, figures or None, values

    def _candidate(self, rt: Running) -> Candidate:
        """A finished trial's model as its backend's measurer takes it
        (:mod:`tuner.serving.measuring`): a measuring pod gets the sweep's priority and its
        trials' memory; a copy for it is staged in the tuner's home, not in the registry."""
        settings = self.engine.settings
        return Candidate(
            sweep_id=self.sweep_id, trial_id=rt.trial_id, owner=self.owner,
            source=rt.paths.artifact_dir / "model", trusted=settings.sweeps_dir,
            max_bytes=int(setting("TUNEHUB_MODEL_MAX_BYTES").number()),
            staging=settings.home / "serving-cost", priority=self.spec.priority,
            memory=self.spec.resources.memory)

    # --- the end -------------------------------------------------------------------------

    async def _cancel_running(self) -> None:
        why = SWEEP_CANCELLED if self.stop_reason is None else SWEEP_STOPPED
        for rt in self.running:
            await self.backend.cancel(rt.trial_id, rt.attempt)
        # Wait for the backend to confirm each one stopped.
        while self.running:
            event = await self.events.get()
            if event is None or not event.final:
                continue
            ended = self.running.current(event.trial_id, event.attempt)
            if ended is None:
                continue
            self.running.pop(event.trial_id)
            # A result that arrived with the cancel (the trial ended by itself) is kept.
            state, value, reason = self._outcome(ended, event)
            if state == TrialState.FAILED:
                state, value, reason = TrialState.CANCELLED, None, why
            await self._finish_trial(ended, state, value, reason)
        self.relaunch.clear()

    def _decide(self, counts: Counts) -> tuple[SweepState, str | None]:
        """How the sweep ends, given its counters."""
        if self.cancel_requested:
            return SweepState.CANCELLED, CANCELLED_REASON
        if self.stop_reason is not None:
            return SweepState.FAILED, self.stop_reason
        if counts.completed == 0:
            return SweepState.FAILED, "no trial completed" + (
                f"; last failure, {self.last_failure}" if self.last_failure else "")
        return SweepState.COMPLETED, None

    async def _finish(self) -> SweepState:
        await self.asked_ahead()
        why = SWEEP_CANCELLED if self.stop_reason is None else SWEEP_STOPPED
        # In a thread: an outage at the end is waited out without stopping the loop.
        state = await asyncio.to_thread(
            self.ledger.end_sweep, self.sweep_id, self._decide, why, lambda: self.study)
        if state == SweepState.COMPLETED and self.spec.promote is not None:
            origin = SweepOrigin(self.sweep_id, self.owner, self.spec, self.code_dir)
            # Copying and checking a model (up to TUNEHUB_MODEL_MAX_BYTES) is file work: off
            # the event loop every sweep of this process shares.
            await asyncio.to_thread(register_best, self.ledger, self.engine.settings,
                                    self.engine.registry, origin, self.spec.promote)
        await self.backend.cleanup(self.sweep_id)
        log.info("sweep %s %s", self.sweep_id, state)
        return state


def note_unused_pod_gpus(rt: Running) -> None:
    """At the end of an attempt whose pod reported its GPUs (Kubernetes), the trial's log says
    which it never used, as a local attempt's does (:mod:`tuner.backends.local.gpu_watch`).
    Written last: the pod's own output is saved into the log before its end is announced."""
    policy = UsePolicy.from_env()
    unused = sorted(g for g, m in rt.gpu_meters.items() if m.unused(policy))
    if not unused:
        return
    held = max((m.last_at - m.since for g, m in rt.gpu_meters.items()
                if g in unused and m.last_at is not None), default=0.0)
    line = (f"tunehub: this attempt held GPU {', '.join(unused)} for {held:.0f} s and never used "
            f"it ({policy.describe()} or more). Does the code run on the CPU?\n")
    try:
        untrusted_files.append(rt.paths.log_path, line.encode())
    except OSError:
        pass  # not a regular file any more: the backend's own open of the log says so

"""The host of a process's sweep controllers: the CLI hosts one sweep, the hub's tuner service
all of them. It starts and stops the backends, and routes what arrives for a trial (its
backend's events, its reports over HTTP) to the controller running it. Controllers see it only
as :class:`~tuner.scheduling.controller.ControllerHost`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tunehub_base.gpu_meter import UseMeter, number_setting
from tunehub_base.gpu_usage import GpuReading
from tunehub_base.settings import Settings
from tuner.backends._base import Backend, TrialEvent
from tuner.db import Database
from tuner.errors import NotFound
from tuner.lifecycle.ledger import Ledger
from tuner.lifecycle.states import SweepState
from tuner.limits import Limits
from tuner.scheduling.controller import (
    ControllerObserver,
    PoolGate,
    SweepController,
    TakenReport,
)
from tuner.scheduling.report_writer import ReportWriter

if TYPE_CHECKING:
    from tuner.serving.registry import Registry

#: Takes an attempt's GPU meters after a reading: (sweep id, trial id, attempt, meters).
GpuUseSink = Callable[[int, int, int, Mapping[str, UseMeter]], None]


class SweepHost:
    """Runs sweep controllers and routes backend events and trial reports to them."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        backends: dict[str, Backend],
        api_url: str,
        registry: Registry | None = None,
        stable_api_url: bool = False,
        replica_url: str | None = None,
    ) -> None:
        """``stable_api_url``: trials can still report to ``api_url`` after this process
        restarts (the tuner service at a fixed address). A restarted controller then keeps
        the attempts its backend adopted (Kubernetes Jobs) instead of rerunning them; with a
        per-process address (the CLI) their reports would go nowhere, so they are rerun.
        ``replica_url``: this process's own address when ``api_url`` is shared by several
        tuners (a Kubernetes Service): its claims record it, and a replica that gets a report
        of a trial it does not run sends it there (:mod:`tuner.api.report_routing`)."""
        self.stable_api_url = stable_api_url
        #: The per-person caps (:mod:`tuner.limits`): every controller of this host asks
        #: :meth:`admits` before it launches, so one person's sweeps share one budget.
        self.limits = Limits.from_env()
        self.db = db
        self.ledger = Ledger(db)
        #: The process's one writer of trials' intermediate values, in group commits.
        self.report_writer = ReportWriter(db)
        self.settings = settings
        self.backends = backends
        self.api_url = api_url.rstrip("/") + "/"
        self.replica_url = (replica_url or api_url).rstrip("/") + "/"
        self.registry = registry
        #: Watch every controller this host runs (:class:`ControllerObserver`).
        self.observers: list[ControllerObserver] = []
        self.controllers: dict[int, SweepController] = {}
        #: The GPU pool's say over GPU trials' starts (the tuner service's queue sets it).
        self.pool_gate: PoolGate | None = None
        #: Where a pod's measured GPU use goes after each reading (sweep, trial id as the
        #: pod's labels carry it, attempt, its meters per GPU): on Kubernetes the pool's ledger
        #: (:class:`tuner.pool_sources.kube_use.PodUseWriter`), so every replica shows it.
        self.gpu_use_sink: GpuUseSink | None = None
        self._by_trial: dict[int, SweepController] = {}
        self._tasks: dict[int, asyncio.Task[SweepState]] = {}

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
        self._by_trial.clear()  # a late report is refused like any other not running
        await asyncio.to_thread(self.report_writer.close)

    def run_sweep(self, sweep_id: int) -> asyncio.Task[SweepState]:
        """Claim the sweep and drive it to the end in a task; the task's result is the
        sweep's final state."""
        if sweep_id in self._tasks and not self._tasks[sweep_id].done():
            return self._tasks[sweep_id]
        controller = SweepController(self, sweep_id)
        controller.claim()
        self.controllers[sweep_id] = controller
        task = asyncio.get_running_loop().create_task(controller.run(), name=f"sweep-{sweep_id}")
        self._tasks[sweep_id] = task

        def _done(_: asyncio.Task[SweepState]) -> None:
            self.controllers.pop(sweep_id, None)
            self._tasks.pop(sweep_id, None)

        task.add_done_callback(_done)
        return task

    def runs(self, sweep_id: int) -> bool:
        """Whether a controller of this host runs the sweep."""
        return sweep_id in self.controllers

    def cancel(self, sweep_id: int) -> bool:
        """Wake the controller of a sweep this host runs to cancel it; False if it is not
        running here. Called by :meth:`tuner.sweep_store.SweepStore.cancel`, the one cancel
        path, once the ledger has marked the sweep ``cancelling``."""
        controller = self.controllers.get(sweep_id)
        if controller is None:
            return False
        controller.cancel()
        return True

    def report(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False, metrics: dict[str, float] | None = None,
    ) -> bool:
        """A trial's report, written before this returns (in the calling thread: the
        in-process backend's route); returns whether the trial should be pruned.
        ``metrics``: a final report of several metrics (``value`` is then ignored)."""
        began = time.perf_counter()
        taken = self._take(trial_id, token, attempt, value, step, last, metrics)
        if taken.row is not None:
            self.report_writer.write(taken.row)
            taken.written()
        return self._answered(trial_id, step, value, taken, began)

    async def report_async(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool = False, metrics: dict[str, float] | None = None,
    ) -> bool:
        """:meth:`report` for the HTTP route: the event loop goes on while the value is
        committed with other reports (:mod:`tuner.scheduling.report_writer`)."""
        began = time.perf_counter()
        taken = self._take(trial_id, token, attempt, value, step, last, metrics)
        if taken.row is not None:
            await asyncio.wrap_future(self.report_writer.submit(taken.row))
            taken.written()
        return self._answered(trial_id, step, value, taken, began)

    async def report_steps_async(
        self, trial_id: int, token: str, attempt: int, steps: list[tuple[int, float]],
        last: bool = False,
    ) -> int | None:
        """Several intermediate values of one attempt in one request, in their order (a trial
        that batches its reports, :func:`tuner.sdk.training.report`): each judged as if sent
        alone, all committed together. Returns the step the trial is pruned at, or None; the
        steps after it are not taken (the trial would not have made them). ``last``: the
        batch's last step is the trial's final one."""
        began = time.perf_counter()
        taken: list[tuple[int, float, TakenReport]] = []
        for n, (step, value) in enumerate(steps):
            judged = self._take(trial_id, token, attempt, value, step,
                                last and n == len(steps) - 1, None)
            taken.append((step, value, judged))
            if judged.pruned:
                break
        futures = [self.report_writer.submit(judged.row) for _, _, judged in taken
                   if judged.row is not None]
        for future in futures:
            await asyncio.wrap_future(future)
        for _, _, judged in taken:
            judged.written()  # nothing for a judged report without a row
        for step, value, judged in taken:
            self._answered(trial_id, step, value, judged, began)
        final = taken[-1]
        return final[0] if final[2].pruned else None

    def batch_seconds(self, trial_id: int) -> float:
        """How long this trial's SDK may hold intermediate values (0: none): only a sweep
        whose answers are always "go on" lets it, since a held value's answer comes late."""
        controller = self._by_trial.get(trial_id)
        if controller is None or controller.spec.prunes:
            return 0.0
        return number_setting("TUNEHUB_REPORT_BATCH_SECONDS")

    def _take(
        self, trial_id: int, token: str, attempt: int, value: float, step: int | None,
        last: bool, metrics: dict[str, float] | None,
    ) -> TakenReport:
        controller = self._by_trial.get(trial_id)
        if controller is None:
            raise NotFound(f"trial {trial_id} is not running")
        return controller.take_report(trial_id, token, attempt, value, step, last, metrics)

    def _answered(self, trial_id: int, step: int | None, value: float, taken: TakenReport,
                  began: float) -> bool:
        for observer in self.observers:
            observer.on_report(taken.sweep_id, trial_id, step, value, taken.pruned,
                               time.perf_counter() - began)
        return taken.pruned

    def gpu_use(self, trial_id: int, token: str, attempt: int,
                readings: list[GpuReading]) -> dict[str, Any]:
        """A running attempt's reading of its own GPUs (a Kubernetes pod's)."""
        controller = self._by_trial.get(trial_id)
        if controller is None:
            raise NotFound(f"trial {trial_id} is not running")
        answer = controller.gpu_use(trial_id, token, attempt, readings)
        rt = controller.running.current(trial_id, attempt)
        if self.gpu_use_sink is not None and rt is not None:
            self.gpu_use_sink(controller.sweep_id, trial_id, rt.attempt, rt.gpu_meters)
        return answer

    def admits(self, owner: str, workers: int) -> bool:
        """Whether ``owner`` may start one more attempt of ``workers`` workers now. Their use
        is counted from what their controllers hold (running attempts × workers), not kept
        in a counter of its own, so it cannot drift from what runs."""
        held = sum(len(c.running) * c.spec.resources.workers
                   for c in self.controllers.values() if c.owner == owner)
        return self.limits.admits(held, workers)

    def track(self, trial_id: int, controller: SweepController) -> None:
        """Route the trial's events and reports to ``controller`` (its attempt started)."""
        self._by_trial[trial_id] = controller

    def untrack(self, trial_id: int) -> None:
        """Stop routing the trial (its attempt ended): late news of it is dropped. The
        owner's other sweeps waiting for a slot under their cap are woken to take it."""
        controller = self._by_trial.pop(trial_id, None)
        if controller is None:
            return
        for other in self.controllers.values():
            if other is not controller and other.owner == controller.owner:
                other.wake()

    async def _route(self, event: TrialEvent) -> None:
        controller = self._by_trial.get(event.trial_id)
        if controller is not None:
            controller.events.put_nowait(event)

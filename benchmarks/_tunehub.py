"""Running tunehub sweeps inside the benchmark process, and timing the controller's steps
from outside ``tuner/``: through the controller's public observer hook
(:class:`~tuner.scheduling.controller.ControllerObserver`), and Optuna's suggestion and tell by
wrapping those public methods for the duration of a run."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunehub_base.settings import Settings, load_settings
from tuner.backends._base import Backend
from tuner.db import Database
from tuner.lifecycle.states import TrialState
from tuner.runtime import LocalRuntime
from tuner.scheduling.controller import ControllerObserver
from tuner.scheduling.host import SweepHost
from tuner.spec import SweepSpec
from tuner.sweep_store import Actor, SweepStore

ACTOR = Actor(name="bench", admin=True)


def settings_for(home: Path, db_url: str, data: Path | None = None) -> Settings:
    os.environ.setdefault("TUNEHUB_LOCAL_GPUS", "")  # no NVML probing: this machine has none
    env = {"TUNEHUB_HOME": str(home), "TUNEHUB_DB_URL": db_url}
    if data is not None:
        env["TUNEHUB_DATA"] = str(data)
    return load_settings(env).ensure_dirs()


@dataclass
class SweepRun:
    sweep_id: int
    state: str
    wall_s: float  # run_sweep's task, from claim to final state
    submit_s: float


async def run_sweep(
    settings: Settings,
    db: Database,
    spec: SweepSpec,
    backend: Backend | str = "local",
    observers: Sequence[ControllerObserver] = (),
) -> SweepRun:
    """Submit ``spec`` and drive it to the end in this process, like ``tunehub sweep run
    --wait`` does. A backend *name* gets the real runtime (report API on loopback); a backend
    *instance* reports in-process, so no HTTP server is needed. ``observers`` watch the
    controller's steps."""
    if isinstance(backend, str):
        async with LocalRuntime(settings, db, [backend]) as engine:
            engine.observers.extend(observers)
            return await _submit_and_run(engine, settings, db, spec, engine.backends[backend])
    async with in_process_engine(settings, db, backend) as engine:
        engine.observers.extend(observers)
        return await _submit_and_run(engine, settings, db, spec, backend)


@contextlib.asynccontextmanager
async def in_process_engine(
    settings: Settings, db: Database, backend: Backend
) -> AsyncIterator[SweepHost]:
    """An engine on a backend whose trials report in-process (no report API is served: its
    URL is a closed port, never called)."""
    engine = SweepHost(db, settings, {backend.name: backend}, "http://127.0.0.1:9/")
    if hasattr(backend, "bind"):
        backend.bind(engine.report)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def _submit_and_run(
    engine: SweepHost, settings: Settings, db: Database, spec: SweepSpec, backend: Backend
) -> SweepRun:
    t0 = time.perf_counter()
    sweep = SweepStore(db, settings).submit(spec, ACTOR, backend)
    t1 = time.perf_counter()
    state = await engine.run_sweep(sweep.id)
    return SweepRun(sweep.id, state, time.perf_counter() - t1, t1 - t0)


@dataclass
class Probe(ControllerObserver):
    """Durations of the controller's steps (``ask``, ``launch``, ``tell``: the ledger's write
    and Optuna's tell of a finished trial, ``report``) as its observer, and of wrapped calls
    (:func:`patched`), in call order: ``calls["ask"][i]`` is (end, seconds)."""

    calls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, name: str, start: float, seconds: float) -> None:
        self.calls.setdefault(name, []).append((start, seconds))

    def seconds(self, name: str) -> list[float]:
        return [d for _, d in self.calls.get(name, [])]

    def _step(self, name: str, seconds: float) -> None:
        self.record(name, time.perf_counter() - seconds, seconds)

    def on_trial_asked(self, sweep_id: int, trial_id: int, seconds: float) -> None:
        self._step("ask", seconds)

    def on_trial_start(
        self, sweep_id: int, trial_id: int, attempt: int, launched_at: float, seconds: float
    ) -> None:
        self._step("launch", seconds)

    def on_report(
        self, sweep_id: int, trial_id: int, step: int | None, value: float, pruned: bool,
        seconds: float,
    ) -> None:
        self._step("report", seconds)

    def on_trial_end(
        self, sweep_id: int, trial_id: int, state: TrialState, value: float | None,
        seconds: float,
    ) -> None:
        self._step("tell", seconds)


def _wrap_sync(probe: Probe, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            probe.record(name, start, time.perf_counter() - start)

    return timed


def _wrap_async(probe: Probe, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            probe.record(name, start, time.perf_counter() - start)

    return timed


class LaunchClock(ControllerObserver):
    """The wall-clock moment the controller began handing each trial's (last) attempt to the
    backend, by trial id."""

    def __init__(self) -> None:
        self.launched: dict[int, float] = {}

    def on_trial_start(
        self, sweep_id: int, trial_id: int, attempt: int, launched_at: float, seconds: float
    ) -> None:
        self.launched[trial_id] = launched_at


@contextlib.contextmanager
def patched(targets: list[tuple[object, str, str]], probe: Probe) -> Iterator[Probe]:
    """Time ``owner.attr`` as ``name`` for each (owner, attr, name) while the block runs;
    the originals are restored afterwards. Nothing in ``tuner/`` changes on disk."""
    saved = []
    for owner, attr, name in targets:
        original = getattr(owner, attr)
        wrap = _wrap_async if asyncio.iscoroutinefunction(original) else _wrap_sync
        saved.append((owner, attr, original))
        setattr(owner, attr, wrap(probe, name, original))
    try:
        yield probe
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def optuna_probe() -> list[tuple[object, str, str]]:
    """Optuna's suggestion and tell inside the controller's steps (their public methods).

    The suggestion is ``optuna.Study.ask`` (the sampler, on the controller's in-memory study);
    the tell is the mirror's, which tells the database study and the memory one."""
    import optuna

    from tuner.search.mirror import StudyMirror

    return [
        (optuna.Study, "ask", "optuna_ask"),
        (StudyMirror, "tell", "optuna_tell"),
    ]

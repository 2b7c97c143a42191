"""Running tunehub sweeps inside the benchmark process, and timing the controller's steps
from outside ``tuner/`` (wrapping its methods for the duration of a run)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.backends._base import Backend
from tuner.controller import Engine, SweepController
from tuner.db import Database
from tuner.runtime import LocalRuntime
from tuner.settings import Settings, load_settings
from tuner.spec import SweepSpec
from tuner.sweeps import Actor, SweepStore

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
) -> SweepRun:
    """Submit ``spec`` and drive it to the end in this process, like ``tunehub sweep run
    --wait`` does. A backend *name* gets the real runtime (report API on loopback); a backend
    *instance* reports in-process, so no HTTP server is needed."""
    if isinstance(backend, str):
        async with LocalRuntime(settings, db, [backend]) as engine:
            return await _submit_and_run(engine, settings, db, spec, engine.backends[backend])
    async with in_process_engine(settings, db, backend) as engine:
        return await _submit_and_run(engine, settings, db, spec, backend)


@contextlib.asynccontextmanager
async def in_process_engine(
    settings: Settings, db: Database, backend: Backend
) -> AsyncIterator[Engine]:
    """An engine on a backend whose trials report in-process (no report API is served: its
    URL is a closed port, never called)."""
    engine = Engine(db, settings, {backend.name: backend}, "http://127.0.0.1:9/")
    if hasattr(backend, "bind"):
        backend.bind(engine)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def _submit_and_run(
    engine: Engine, settings: Settings, db: Database, spec: SweepSpec, backend: Backend
) -> SweepRun:
    t0 = time.perf_counter()
    sweep = SweepStore(db, settings).submit(spec, ACTOR, backend)
    t1 = time.perf_counter()
    state = await engine.run_sweep(sweep.id)
    return SweepRun(sweep.id, state, time.perf_counter() - t1, t1 - t0)


@dataclass
class Probe:
    """Durations of wrapped calls, in call order: ``calls["ask"][i]`` is (start, seconds)."""

    calls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, name: str, start: float, seconds: float) -> None:
        self.calls.setdefault(name, []).append((start, seconds))

    def seconds(self, name: str) -> list[float]:
        return [d for _, d in self.calls.get(name, [])]


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


def controller_probe() -> list[tuple[object, str, str]]:
    """The controller's per-trial steps and Optuna's suggestion and tell inside them.

    The suggestion is ``optuna.Study.ask`` (the sampler, on the controller's in-memory study);
    the tell is the mirror's, which tells the database study and the memory one."""
    import optuna

    from tuner.mirror import StudyMirror

    return [
        (SweepController, "_ask", "ask"),
        (SweepController, "_launch", "launch"),
        (SweepController, "_finish_trial", "tell"),
        (SweepController, "report", "report"),
        (optuna.Study, "ask", "optuna_ask"),
        (StudyMirror, "tell", "optuna_tell"),
    ]

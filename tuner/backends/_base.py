"""The execution backend interface: how a trial attempt becomes a running process somewhere.

Backends are event-driven: the controller calls :meth:`Backend.launch` and the backend later reports
what happened as :class:`TrialEvent` s to every callback registered with :meth:`Backend.subscribe`
(the :class:`~tuner.scheduling.host.SweepHost` registers one and hands each event to the controller
of its trial). Nobody polls trials: what an event costs does not depend on how many trials are
running.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.lifecycle.states import EventKind
from tuner.snapshot import CODE_SNAPSHOT_LIMIT, CodeSource, copy_snapshot
from tuner.spec import Resources, SweepSpec

if TYPE_CHECKING:
    from tuner.serving.measuring import Measurer

# What a trial process on this machine must not inherit from the process that starts it (the
# tuner service or the CLI): the hub's token of the service and its settings (JUPYTERHUB_*,
# JPY_*), tunehub's settings, among them the database URL (TUNEHUB_*; a trial gets the few it
# needs from its launch), and cluster credentials.
_NOT_INHERITED_PREFIXES = ("JUPYTERHUB_", "JPY_", "TUNEHUB_")
_NOT_INHERITED = frozenset({"KUBECONFIG"})


def inherited_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local trial (or the warm-start process it forks from) starts with,
    before its launch's own variables: this process's, minus the platform's secrets."""
    env = dict(os.environ if environ is None else environ)
    return {
        k: v for k, v in env.items()
        if not k.startswith(_NOT_INHERITED_PREFIXES) and k not in _NOT_INHERITED
    }


Ignore = Callable[[str, list[str]], set[str]]  # what shutil.copytree leaves out

# How a started event's reason begins when the trial paid its imports itself.
COLD = "cold start"
# How the sweep's note begins when warm trials still imported packages after their start.
NOT_WARM = "not fully warm"


def not_fully_warm(modules: Iterable[str]) -> str:
    """The sweep's note (``cold_start`` in its view) when warm-started trials imported
    ``modules`` themselves: each trial paid for them, and the spec's ``preload`` can fix it."""
    names = ", ".join(modules)
    return (f"{NOT_WARM}: trials imported {names} themselves after their warm start; list "
            "them in the spec's preload: to have them preloaded")


@dataclass(frozen=True)
class TrialLaunch:
    """Everything a backend needs to run one attempt of one trial."""

    sweep_id: int
    trial_id: int
    number: int
    attempt: int
    command: str
    workdir: Path
    env: dict[str, str]
    resources: Resources
    timeout: float | None
    log_path: Path
    priority: str = "normal"
    owner: str = ""
    sweep_name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # The spec's ``preload`` (warm starts of the local backend).
    preload: str | tuple[str, ...] = "auto"

    @property
    def key(self) -> tuple[int, int]:
        return (self.trial_id, self.attempt)


@dataclass(frozen=True)
class TrialEvent:
    """A state change of one attempt. ``reason`` is for people: shown on the trial.
    ``waiting``: the attempt was submitted but cannot start yet, and ``reason`` says why (e.g.
    the namespace's quota is full); it is not an outcome: ``started`` or an outcome follows."""

    trial_id: int
    attempt: int
    kind: EventKind
    exit_code: int | None = None
    reason: str = ""
    # An outcome of a warm-started attempt: the packages it imported itself after its start,
    # most costly first (empty: fully warm); None where nobody measured (cold, or killed).
    imported_after_start: tuple[str, ...] | None = None

    @property
    def final(self) -> bool:
        """An outcome (succeeded or failed), not news about a still-live attempt."""
        return EventKind(self.kind).is_final()


OnEvent = Callable[[TrialEvent], Awaitable[None] | None]


class Backend(abc.ABC):
    """Runs trial attempts. One instance may serve several sweeps at once."""

    name: str = "base"

    def __init__(self) -> None:
        self._listeners: list[OnEvent] = []

    def subscribe(self, on_event: OnEvent) -> None:
        """Register a callback for every :class:`TrialEvent` this backend emits."""
        self._listeners.append(on_event)

    def unsubscribe(self, on_event: OnEvent) -> None:
        if on_event in self._listeners:
            self._listeners.remove(on_event)

    async def emit(self, event: TrialEvent) -> None:
        for listener in list(self._listeners):
            result = listener(event)
            if result is not None:
                await result

    def check(self, spec: SweepSpec) -> None:
        """Raise :class:`tuner.spec.SpecError` when this backend can never run ``spec``'s
        trials (more GPUs than exist, unknown GPU type): refuse at submission, not later."""

    def snapshot_code(self, source: CodeSource | Path | None, target: Path, ignore: Ignore,
                      files: dict[str, bytes], owner: str) -> None:
        """Copy a sweep's code (``source``, may be ``None``) plus ``files`` into ``target``, which
        does not exist yet. A backend that runs trials as their owner copies with the owner's
        rights, so nobody snapshots what they could not read."""
        if source is not None:
            copy_snapshot(source, target, ignore, CODE_SNAPSHOT_LIMIT)  # never follows a link
        else:
            target.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (target / name).write_bytes(data)

    def can_launch(self, resources: Resources) -> bool:
        """Whether an attempt with ``resources`` could start right now (free GPUs)."""
        return True

    def measurer(self) -> Measurer:
        """Where this backend's candidate models are measured for their serving cost
        (:mod:`tuner.serving.measuring`): on this machine, as the owner's trials start (their
        Unix user where the backend has people's Unix users, ``unix``)."""
        from tuner.serving.cost import ModelProcess
        from tuner.serving.measuring import LocalMeasurer

        unix = getattr(self, "unix", None)
        return LocalMeasurer(lambda owner: ModelProcess.of_owner(
            unix.require(owner) if unix is not None else None))

    async def start(self) -> None:
        """Connect, start watches. Called once before the first launch."""

    @abc.abstractmethod
    async def launch(self, launch: TrialLaunch) -> None:
        """Start the attempt; return once it is submitted. Outcome arrives as events."""

    @abc.abstractmethod
    async def cancel(self, trial_id: int, attempt: int) -> None:
        """Stop the attempt if it runs; a ``failed`` event follows."""

    async def preempt(self, trial_id: int, attempt: int) -> bool:
        """Stop the attempt for the GPU pool (SIGTERM, its grace period, then SIGKILL); a
        ``preempted`` event follows. False when it does not run here or this backend cannot
        (on Kubernetes, Kueue preempts)."""
        return False

    async def reconcile(self, sweep_id: int, running: list[TrialLaunch]) -> set[tuple[int, int]]:
        """After a controller restart: which of ``running`` (trial_id, attempt) still run and
        are adopted (their events will arrive as usual). The rest are gone."""
        return set()

    async def cleanup(self, sweep_id: int) -> None:
        """Remove whatever the backend keeps for a finished sweep."""

    async def close(self) -> None:
        """Stop watches and release resources (running attempts are left to reconcile)."""

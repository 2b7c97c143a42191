"""The attempts a controller has out: what it knows of each while it runs, and the set of them,
whose every trial the host routes reports and backend events for to that controller (told
through the two callables the controller gives it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tunehub_base.gpu_meter import UseMeter
from tuner import metrics
from tuner.lifecycle.trial_paths import TrialPaths
from tuner.search.mirror import MirroredTrial


@dataclass
class Running:
    """One running attempt as its controller sees it."""

    trial_id: int
    number: int
    attempt: int
    token_hash: str
    optuna_trial: MirroredTrial
    paths: TrialPaths
    last_value: float | None = None
    last_step: int | None = None
    final_value: float | None = None  # a report without a step: the result
    #: Every metric of that final report, when it gave several (``tuner.report({...})``).
    final_metrics: dict[str, float] | None = None
    pruned: bool = False
    waiting: bool = False  # its reason says why it cannot start yet
    #: Earlier attempts of the trial the GPU pool stopped (not retries: see max_retries).
    preemptions: int = 0
    #: The GPU pool is stopping this attempt for a notebook (set when it was asked to).
    preempting: bool = False
    #: Its GPUs' measured use, as its pod reports it (Kubernetes; GPU id -> meter).
    gpu_meters: dict[str, UseMeter] = field(default_factory=dict)

    @property
    def retries_used(self) -> int:
        """Attempts so far that count against ``max_retries``: all but the preempted ones."""
        return self.attempt - self.preemptions

    @property
    def key(self) -> tuple[int, int]:
        return (self.trial_id, self.attempt)


class RunningAttempts:
    """A controller's running attempts by trial id. Adding one calls ``on_add`` with its trial
    (the host routes the trial to the controller from then on), removing it ``on_remove``, and
    the running-trials gauge follows both."""

    def __init__(
        self, on_add: Callable[[int], None], on_remove: Callable[[int], None]
    ) -> None:
        self._on_add = on_add
        self._on_remove = on_remove
        self._by_trial: dict[int, Running] = {}

    def add(self, rt: Running) -> None:
        self._by_trial[rt.trial_id] = rt
        self._on_add(rt.trial_id)
        metrics.TRIALS_RUNNING.inc()

    def pop(self, trial_id: int) -> Running:
        rt = self._by_trial.pop(trial_id)
        self._on_remove(trial_id)
        metrics.TRIALS_RUNNING.dec()
        return rt

    def get(self, trial_id: int) -> Running | None:
        return self._by_trial.get(trial_id)

    def current(self, trial_id: int, attempt: int) -> Running | None:
        """The running attempt ``attempt`` of the trial; None for an old attempt's late news."""
        rt = self._by_trial.get(trial_id)
        return rt if rt is not None and rt.attempt == attempt else None

    def __len__(self) -> int:
        return len(self._by_trial)

    def __iter__(self) -> Iterator[Running]:
        return iter(list(self._by_trial.values()))

"""Where a candidate model's serving cost is measured: one seam, one implementation per mode.

The controller asks its backend for a :class:`Measurer` (:meth:`tuner.backends.Backend.measurer`)
and hands it a :class:`Candidate` (a trial's saved model); every implementation returns the
same figures (:mod:`tuner.serving.cost`) measured the same way (one
:class:`~tuner.serving.cost.CostMethod`), or raises :class:`~tuner.serving.cost.CostError`
(or :class:`~tuner.serving.intake.ModelRefused`) whose message becomes the trial's
"serving cost not measured: ..." reason.

- :class:`LocalMeasurer` (one machine): a child process started as the model's owner's trials
  are (:meth:`~tuner.serving.cost.ModelProcess.of_owner`).
- ``KubernetesMeasurer`` (:mod:`tuner.backends.kubernetes.measuring`): a measuring pod,
  because the tuner's own pod holds a ServiceAccount token and runs no model.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.serving.cost import CostMethod, ModelProcess, measure_trial_model


@dataclass(frozen=True)
class Candidate:
    """One trial's model to measure. ``source``: the model directory the trial wrote, below
    ``trusted`` (a directory only the platform changes, so the copy's no-follow walk starts
    from ground the platform holds); ``staging``: a directory of the platform's on the data
    store where a copy may be put for a measuring pod to mount."""

    sweep_id: int
    trial_id: int
    owner: str
    source: Path
    trusted: Path
    max_bytes: int
    staging: Path
    priority: str = "normal"
    memory: str = "2Gi"
    method: CostMethod = field(default_factory=CostMethod)


class Measurer(abc.ABC):
    """Measures what serving a :class:`Candidate` costs. Called from a worker thread (the
    trial's finishing thread), never from the event loop: it may take a while."""

    @abc.abstractmethod
    def measure(self, candidate: Candidate) -> dict[str, float]:
        """``model_size_mb``, ``serving_latency_p50_ms`` and ``serving_latency_p95_ms``."""


class LocalMeasurer(Measurer):
    """On this machine: the model copied the registry's way into a scratch directory, then
    served by a child process that ``process_of(owner)`` says how to start."""

    def __init__(self, process_of: Callable[[str], ModelProcess]) -> None:
        self.process_of = process_of

    def measure(self, candidate: Candidate) -> dict[str, float]:
        return measure_trial_model(candidate.source, candidate.trusted, candidate.max_bytes,
                                   self.process_of(candidate.owner), candidate.method)

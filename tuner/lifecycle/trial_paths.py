"""Where one trial's files live, as the ledger records them: the layout, not the files.

The ledger stores these paths on a trial's row and the scheduling layer lays the files out
(:mod:`tuner.scheduling.workdirs`); the layout sits here, below both, so the ledger never
imports the layer that schedules.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class _HasPaths(Protocol):
    workdir: str
    log_path: str | None
    artifact_dir: str | None


@dataclass(frozen=True)
class TrialPaths:
    """Where one trial's files live (all its attempts share them)."""

    workdir: Path
    log_path: Path
    artifact_dir: Path

    @classmethod
    def new(cls, sweep_dir: Path, number: int) -> TrialPaths:
        """The layout of trial ``number`` of the sweep in ``sweep_dir``."""
        workdir = sweep_dir / "trials" / str(number)
        return cls(workdir, workdir / "trial.log", workdir / "artifacts")

    @classmethod
    def of(cls, row: _HasPaths) -> TrialPaths:
        """The paths a trial row recorded (rows of old versions may lack some)."""
        workdir = Path(row.workdir)
        return cls(
            workdir,
            Path(row.log_path) if row.log_path else workdir / "trial.log",
            Path(row.artifact_dir) if row.artifact_dir else workdir / "artifacts",
        )

    @property
    def checkpoint_dir(self) -> Path:
        """Where the trial's attempts keep their checkpoint (:mod:`tuner.sdk.checkpoints`): in
        the trial's directory, so it outlives every attempt and sits on the artifacts' volume
        (a Kubernetes trial pod mounts its whole directory). Derived, not a column: every
        trial row's directory has one."""
        return self.workdir / "checkpoints"

    def has_model(self) -> bool:
        """Whether the trial saved a model (``tuner.save_model``): a hint that registration
        is worth trying, read without following a link the trial put last. The registry's
        no-follow intake (:mod:`tuner.serving.intake`) is what judges the model."""
        try:
            return stat.S_ISREG(os.lstat(self.artifact_dir / "model" / "saved_model.pb").st_mode)
        except OSError:
            return False

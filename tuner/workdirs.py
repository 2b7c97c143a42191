"""A trial's files: its working directory (the sweep's code linked in), its artifacts, and its
log, where each attempt begins with a tunehub header line and the user's output follows.

The controller decides when an attempt starts; this module only lays out and reads the files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: Every header line tunehub writes into a trial's log begins so; :func:`log_tail` skips them.
HEADER = "=== tunehub:"
LOG_TAIL_LINES = 8
LOG_TAIL_BYTES = 16_384


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

    def has_model(self) -> bool:
        """Whether the trial saved a model (``tuner.save_model``) the registry can take."""
        return (self.artifact_dir / "model" / "saved_model.pb").exists()


def prepare_workdir(paths: TrialPaths, code_dir: Path | None) -> None:
    """The trial's own directory, with the sweep's code snapshot linked in so
    ``python train.py`` works and outputs stay per trial."""
    fresh = not paths.workdir.exists()
    paths.workdir.mkdir(parents=True, exist_ok=True)
    paths.artifact_dir.mkdir(parents=True, exist_ok=True)
    if fresh and code_dir is not None and code_dir.is_dir():
        for entry in code_dir.iterdir():
            link = paths.workdir / entry.name
            if not link.exists():
                link.symlink_to(entry)


def write_attempt_header(
    log_path: Path, number: int, attempt: int, previous_reason: str | None
) -> None:
    """The line that opens an attempt in the trial's log; a retry says what ended the last."""
    why = f" (after: {previous_reason})" if attempt > 1 and previous_reason else ""
    with open(log_path, "a") as fh:
        fh.write(f"{HEADER} trial {number}, attempt {attempt}{why} ===\n")


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
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(HEADER)]
    return "\n".join(kept[-lines:])

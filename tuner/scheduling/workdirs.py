"""A trial's files: its working directory (the sweep's code linked in), its artifacts, and its
log, where each attempt begins with a tunehub header line and the user's output follows.

The controller decides when an attempt starts; this module only lays out and reads the files.
"""

from __future__ import annotations

from pathlib import Path

from tuner import untrusted_files
from tuner.lifecycle.trial_paths import TrialPaths

#: Every header line tunehub writes into a trial's log begins so; :func:`log_tail` skips them.
HEADER = "=== tunehub:"
LOG_TAIL_LINES = 8
LOG_TAIL_BYTES = 16_384


def prepare_workdir(paths: TrialPaths, code_dir: Path | None) -> None:
    """The trial's own directory, with the sweep's code snapshot linked in so
    ``python train.py`` works and outputs stay per trial."""
    fresh = not paths.workdir.exists()
    paths.workdir.mkdir(parents=True, exist_ok=True)
    paths.artifact_dir.mkdir(parents=True, exist_ok=True)
    paths.checkpoint_dir.mkdir(exist_ok=True)
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
    try:
        untrusted_files.append(log_path, f"{HEADER} trial {number}, attempt {attempt}{why} ===\n"
                               .encode())
    except OSError:
        pass  # not a regular file any more: the backend's own open of the log says so


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines a trial printed (tunehub's own header lines left out): usually the
    traceback that says why it failed."""
    try:
        text = untrusted_files.read_tail(path, LOG_TAIL_BYTES)[0].decode(errors="replace")
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(HEADER)]
    return "\n".join(kept[-lines:])

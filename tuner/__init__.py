"""tunehub's tuner: sweeps of training trials over a shared pool, and what trials import.

In training code::

    import tuner
    p = tuner.params({"lr": 1e-3})
    ...
    tuner.report(val_accuracy, step=epoch)   # raises tuner.Pruned when pruned
    tuner.save_model(model)

A retried trial resumes: ``tuner.checkpoint(state, step)`` / ``tuner.restore()``.
"""

from __future__ import annotations

from typing import Any

from tuner.sdk.checkpoints import checkpoint, checkpoint_dir, restore, resume_step
from tuner.sdk.training import (
    Pruned,
    artifact_dir,
    data_dir,
    in_trial,
    is_chief,
    params,
    report,
    save_model,
)

__all__ = [
    "Pruned",
    "Sweep",
    "artifact_dir",
    "checkpoint",
    "checkpoint_dir",
    "data_dir",
    "in_trial",
    "is_chief",
    "keras",
    "params",
    "report",
    "restore",
    "resume_step",
    "save_model",
]


def __getattr__(name: str) -> Any:
    # Heavy parts load on first use so a trial that only reports starts fast.
    if name == "keras":
        import tuner.sdk.keras as module

        return module
    if name == "Sweep":
        from tuner.sdk.client import Sweep

        return Sweep
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")

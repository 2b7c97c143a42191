"""Keras integration: report an epoch metric to the sweep and stop when pruned."""

from __future__ import annotations

from typing import Any

import keras

from tuner.trial import report


class ReportCallback(keras.callbacks.Callback):
    """Reports ``logs[metric]`` at the end of every epoch (step = epoch number, from 1).

    :class:`tuner.Pruned` propagates out of ``model.fit`` when the pruner stops the trial.
    """

    def __init__(self, metric: str = "val_accuracy") -> None:
        super().__init__()
        self.metric = metric

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.metric not in logs:
            known = ", ".join(sorted(logs)) or "none"
            raise KeyError(f"metric {self.metric!r} is not in this epoch's logs (have: {known})")
        epochs = (self.params or {}).get("epochs")
        last = isinstance(epochs, int) and epoch + 1 >= epochs
        report(float(logs[self.metric]), step=epoch + 1, last=last)

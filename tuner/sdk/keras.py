"""Keras integration: report an epoch metric to the sweep, stop when pruned, and resume a retried
trial from its checkpoint."""

from __future__ import annotations

import sys
from typing import Any

import keras

from tuner.sdk.checkpoints import checkpoint, restore, resume_step
from tuner.sdk.training import report


def initial_epoch() -> int:
    """The epoch this attempt resumes at: the number of epochs the trial's checkpoint holds (0
    without one). :class:`ReportCallback` already starts ``fit`` there by itself on Keras 3;
    pass ``model.fit(..., initial_epoch=tuner.keras.initial_epoch())`` to be explicit (or on a
    Keras that the callback cannot move)."""
    return resume_step()


class ReportCallback(keras.callbacks.Callback):
    """Reports ``logs[metric]`` at the end of every epoch (step = epoch number, from 1), and
    checkpoints the trial every ``checkpoint_every`` epochs (``None`` or 0: never).

    Checkpoints: at each checkpointing epoch's end, after its report, the model's weights and
    its optimizer's variables and the epoch count are saved with :func:`tuner.checkpoint`
    (atomically: a crash mid-save keeps the previous one). When ``fit`` begins and the trial has a
    checkpoint (a retry, a rerun after the controller died), the callback loads it and ``fit``
    continues at the next epoch, the way ``keras.callbacks.BackupAndRestore`` resumes: epochs
    already reported are not trained or reported again. The model must be built and compiled
    before ``fit`` (it is, for a ``Sequential`` with an ``Input``).

    :class:`tuner.Pruned` propagates out of ``model.fit`` when the pruner stops the trial.
    """

    def __init__(self, metric: str = "val_accuracy", checkpoint_every: int | None = 1) -> None:
        super().__init__()
        self.metric = metric
        self.checkpoint_every = checkpoint_every or 0
        self.resumed_at = 0  # the epoch this attempt's fit resumed at (0: from scratch)
        self._first_epoch = True
        self._last_value: float | None = None

    # --- restoring ---------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._first_epoch = True
        if not self.checkpoint_every:
            return
        found = restore()
        if found is None:
            return
        state, step = found
        _load(self.model, state)
        self.resumed_at = step
        self._last_value = state.get("value")
        if hasattr(self.model, "_initial_epoch"):  # Keras 3: what BackupAndRestore sets
            self.model._initial_epoch = step
        print(f"tunehub: resumed from the checkpoint after epoch {step}", file=sys.stderr)
        epochs = (self.params or {}).get("epochs")
        if isinstance(epochs, int) and step >= epochs and self._last_value is not None:
            # The last attempt trained to the end and died afterwards: its result stands.
            report(float(self._last_value), step=step, last=True)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._first_epoch and self.resumed_at and epoch != self.resumed_at:
            raise RuntimeError(
                f"the checkpoint holds {self.resumed_at} epochs but fit starts at epoch "
                f"{epoch}: pass initial_epoch=tuner.keras.initial_epoch() to model.fit")
        self._first_epoch = False

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.resumed_at and hasattr(self.model, "_initial_epoch"):
            self.model._initial_epoch = None  # a later fit of this model starts as asked

    # --- reporting and saving ---------------------------------------------------------------

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.metric not in logs:
            known = ", ".join(sorted(logs)) or "none"
            raise KeyError(f"metric {self.metric!r} is not in this epoch's logs (have: {known})")
        epochs = (self.params or {}).get("epochs")
        last = isinstance(epochs, int) and epoch + 1 >= epochs
        value = float(logs[self.metric])
        # Report first, then save: a crash in between reports this epoch again on the next
        # attempt (the tuner keeps one value per step); the other order could lose its report.
        report(value, step=epoch + 1, last=last)
        if self.checkpoint_every and (epoch + 1) % self.checkpoint_every == 0:
            checkpoint(_state(self.model, value), step=epoch + 1)


def _state(model: Any, value: float) -> dict[str, Any]:
    optimizer = getattr(model, "optimizer", None)
    variables = list(getattr(optimizer, "variables", None) or [])
    return {
        "weights": model.get_weights(),
        "optimizer": [keras.ops.convert_to_numpy(v) for v in variables],
        "value": value,
    }


def _load(model: Any, state: dict[str, Any]) -> None:
    model.set_weights(state["weights"])
    saved = state.get("optimizer") or []
    optimizer = getattr(model, "optimizer", None)
    if not saved or optimizer is None:
        return
    if not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)  # its variables exist before they are set
    variables = list(optimizer.variables)
    if len(variables) != len(saved) or any(
            tuple(v.shape) != tuple(s.shape) for v, s in zip(variables, saved, strict=True)):
        print("tunehub: the checkpoint's optimizer state does not fit this optimizer; "
              "its weights are restored, the optimizer starts fresh", file=sys.stderr)
        return
    for variable, value in zip(variables, saved, strict=True):
        variable.assign(value)

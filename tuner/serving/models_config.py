"""TensorFlow Serving's model config, written by the registry whenever a stage moves.

TensorFlow Serving started with ``--model_config_file=<registry>/models.config`` and
``--model_config_file_poll_wait_seconds`` re-reads this file and reloads without a restart. Each
model with a promoted version is listed with exactly its ``production`` and ``canary``
versions loaded (``model_version_policy { specific { ... } }``) and the version labels
``stable`` (production) and ``canary`` pointing at them, so clients can call
``/v1/models/NAME/labels/stable:predict``. Assigning a label to a version that is still loading
needs ``--allow_version_labels_for_unavailable_models`` (the chart sets it).

TensorFlow Serving moves an existing label only to a version that has finished loading (the
flag above covers new labels only), and re-applies the file on every poll. So the version that
most recently lost its stage stays loaded (``previous``): while a new production version loads,
``stable`` keeps answering from the old one, and a later poll moves the label. It is also what
a rollback promotes back to, already in memory.

The file is replaced atomically (written beside it, then renamed) under a lock, and its content
is computed from the database inside that lock: two promotions racing from two processes
always leave the state of the later one, and a poll never reads half a file.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CONFIG_NAME = "models.config"
LABELS = {"stable": "production", "canary": "canary"}  # TF Serving label -> registry stage


@dataclass(frozen=True)
class ServedModel:
    """One model as TensorFlow Serving should load it."""

    name: str
    production: int | None
    canary: int | None
    previous: int | None = None  # kept loaded, unlabelled: see the module docstring

    @property
    def versions(self) -> list[int]:
        labelled = {v for v in (self.production, self.canary) if v is not None}
        if not labelled:
            return []
        return sorted(labelled | ({self.previous} if self.previous is not None else set()))


def _quote(text: str) -> str:
    """A protobuf text-format string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def render(models: Iterable[ServedModel], base: str) -> str:
    """The ``ModelServerConfig`` text proto for ``models`` under ``base`` (the registry's root
    as TensorFlow Serving sees it)."""
    lines = [
        "# Written by tunehub's model registry whenever a production or canary stage moves;",
        "# TensorFlow Serving re-reads it. Edits here are overwritten by the next promotion.",
        "model_config_list {",
    ]
    for m in sorted(models, key=lambda m: m.name):
        if not m.versions:
            continue
        lines += [
            "  config {",
            f"    name: {_quote(m.name)}",
            f"    base_path: {_quote(base.rstrip('/') + '/' + m.name)}",
            '    model_platform: "tensorflow"',
            "    model_version_policy {",
            "      specific {",
            *(f"        versions: {v}" for v in m.versions),
            "      }",
            "    }",
        ]
        for label, stage in LABELS.items():
            version = getattr(m, stage)
            if version is not None:
                lines += ["    version_labels {", f"      key: {_quote(label)}",
                          f"      value: {version}", "    }"]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


class ServingConfig:
    """The config file of one registry root."""

    def __init__(self, root: Path, base: str | None = None) -> None:
        self.path = Path(root) / CONFIG_NAME
        self.base = base or str(root)

    def write(self, read_models: Callable[[], Iterable[ServedModel]]) -> Path:
        """Replace the file with ``render(read_models())``; ``read_models`` runs under the lock
        so what is written is never older than what another writer wrote."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(f".{CONFIG_NAME}.lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = render(read_models(), self.base)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{CONFIG_NAME}.")
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, 0o644)  # TensorFlow Serving may run as another user
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return self.path

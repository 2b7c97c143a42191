"""Writing small trial scripts and specs for engine tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml


def write_sweep(directory: Path, script: str, **spec: Any) -> Path:
    """A code directory with ``train.py`` and a ``sweep.yaml`` running it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(textwrap.dedent(script))
    data: dict[str, Any] = {
        "name": "t",
        "command": "python train.py",
        "metric": "score",
        "trials": 4,
        "parallelism": 2,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }
    data.update(spec)
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def parse_json(stdout: str) -> Any:
    return json.loads(stdout)

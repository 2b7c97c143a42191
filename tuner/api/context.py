"""What the service's handlers share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.backends import Backend
from tuner.engine import Engine
from tuner.sweeps import SweepStore


@dataclass
class ServiceContext:
    engine: Engine
    store: SweepStore
    registry: Any
    hub_auth: Any
    backends: dict[str, Backend]
    default_backend: str = "local"

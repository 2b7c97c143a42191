"""Where the pool view comes from: one source per mode, behind one small base class, so the
API, the CLI and the page show the same fields whichever mode runs.

- :mod:`.local`: this machine's GPUs, from the lock directory (and the tuner's queue).
- :mod:`.kubernetes`: the cluster's, from the Kubernetes API (pods, Kueue's ClusterQueue and
  Workloads, its visibility API) and the GPU-hours recorded in the database.

Both answer ``pool()`` with ``mode``, ``gpu_source``, ``total``, ``held``, ``gpus`` (rows:
``gpu``, ``state``, ``holder``, ``since``...), ``queue`` (position, person, kind, what, gpus,
priority, since, reason), ``shares`` and ``groups``; the Kubernetes one adds ``flavors``.
``usage(since)`` answers what :func:`tunehub_base.gpu_holders.usage_report` sums. Only reads:
nothing here changes who holds what."""

from __future__ import annotations

import abc
from typing import Any


class PoolSource(abc.ABC):
    """Reads the pool of one mode."""

    mode: str = ""

    async def start(self) -> None:
        """Begin whatever the source keeps up to date (the Kubernetes GPU-hours watch)."""

    async def close(self) -> None:
        """Stop it."""

    @abc.abstractmethod
    async def pool(self) -> dict[str, Any]:
        """Each GPU (or GPU-holding pod), who holds it since when; the queue; shares."""

    @abc.abstractmethod
    async def usage(self, since: float) -> dict[str, Any]:
        """Allocated GPU-hours from ``since`` to now, per person, group, sweep, notebook."""

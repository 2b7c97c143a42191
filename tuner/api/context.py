"""What the service's handlers share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from jupyterhub.services.auth import HubOAuth

from tuner.backends import Backend
from tuner.pool_sources import PoolSource
from tuner.scheduling.gpu_queue import GpuQueue
from tuner.scheduling.host import SweepHost
from tuner.serving.registry import Registry
from tuner.sweep_store import SweepStore


class RefreshedMetrics(Protocol):
    """A collector whose figures need awaited reads, taken by the scrape before rendering
    (:class:`tuner.queue_metrics.GpuQueueCollector`, :class:`tuner.pool_sources.kube_metrics.
    KubePoolCollector`)."""

    async def refresh(self) -> None: ...


@dataclass
class ServiceContext:
    """The service's long-lived parts, handed to every handler by ``initialize(ctx=...)``.

    Built once by :func:`tuner.service.serve`; the handlers reach the database only through
    ``store`` and ``registry``, so each seam has the one owner that checks ownership."""

    engine: SweepHost
    store: SweepStore
    registry: Registry
    # The process's one HubOAuth (see tuner.api.auth.make_hub_auth): the login state of the
    # OAuth callback lives in it.
    hub_auth: HubOAuth
    backends: dict[str, Backend]
    default_backend: str = "local"
    #: Notebooks waiting for this machine's GPUs (the local backend's pool); None without it.
    gpu_queue: GpuQueue | None = None
    #: The pool's metrics that the scrape refreshes first: the local queue's and shares'
    #: (with ``gpu_queue``), or the cluster's pool (with a Kubernetes ``pool_source``).
    pool_metrics: RefreshedMetrics | None = None
    #: Where ``GET pool`` and ``GET usage`` read the pool (:mod:`tuner.pool_sources`): the
    #: cluster's when the default backend is Kubernetes; None: this machine's lock directory.
    pool_source: PoolSource | None = None

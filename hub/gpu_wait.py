"""The hub's side of the GPU pool's queue: a GPU notebook on a full pool asks the tuner for its
GPUs (``POST api/v1/pool/requests``) and waits with a position instead of being refused.

The tuner decides (:mod:`tuner.scheduling.gpu_queue`: the pool's policy, and the preemption of
a trial for the notebook); the spawner keeps trying the GPUs' lock files itself, and asks again
every poll while it waits, which keeps its request alive (a hub that stops asking lets it
lapse). The tuner unreachable is waited out: the notebook keeps waiting with that reason, and
takes a GPU as soon as one is free, tuner or not.

Authenticated service to service with the secret the two share in the GPU lock directory
(:mod:`tunehub_base.pool_secret`); over the platform's internal TLS on one machine, the
tuner's certificate pinned like the notebooks' client pins it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tunehub_base import pool_secret, tls

TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Waiting:
    """Where a waiting notebook stands: ``ready`` to take GPUs, or its ``message`` for the
    spawn page (its position and reason)."""

    ready: bool
    message: str
    position: int | None = None


class PoolQueueClient:
    """Asks the tuner's pool queue for GPUs for one server."""

    def __init__(self, url: str, lock_dir: Path, ca: str | None = None) -> None:
        self.url = url
        self.lock_dir = lock_dir
        self.verify: ssl.SSLContext | bool = (
            tls.pinned_client_context(ca, tls.SERVICE_IDENTITY) if ca else True)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {pool_secret.pool_secret(self.lock_dir)}"}

    async def ask(self, person: str, server: str, groups: list[str], gpus: int) -> Waiting:
        """Queue (or keep queued) the server's ask; a tuner that does not answer is a reason
        to show, never an error of the spawn."""
        body = {"person": person, "server": server, "groups": groups, "gpus": gpus}
        try:
            async with httpx.AsyncClient(verify=self.verify, timeout=TIMEOUT_SECONDS) as client:
                r = await client.post(self.url, json=body, headers=self._headers())
            answer: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError, OSError) as exc:
            return Waiting(False, "waiting for a GPU: the tuner (which can stop a trial for "
                           f"you) does not answer ({type(exc).__name__}); you get the next GPU "
                           "freed")
        if r.status_code != 200:
            return Waiting(False, f"waiting for a GPU (the tuner's queue: "
                           f"{str(answer.get('error'))[:200]})")
        return Waiting(bool(answer.get("ready")), str(answer.get("message"))[:500],
                       answer.get("position"))

    async def withdraw(self, person: str, server: str) -> None:
        """The server got its GPUs or gave up: its ask leaves the queue (if the tuner does
        not hear it, the ask lapses by itself)."""
        try:
            async with httpx.AsyncClient(verify=self.verify, timeout=TIMEOUT_SECONDS) as client:
                await client.delete(self.url, params={"person": person, "server": server},
                                    headers=self._headers())
        except (httpx.HTTPError, OSError):
            pass

"""The pool of this machine: the lock directory's holders and ledger
(:mod:`tuner.pool_view`), and, where the tuner runs a local GPU queue, its queue and shares."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tuner.pool_sources._base import PoolSource
from tuner.pool_view import pool_view, usage_view
from tuner.scheduling.gpu_queue import GpuQueue


class LocalPoolSource(PoolSource):
    mode = "local"

    def __init__(self, lock_dir: Path, gpu_queue: GpuQueue | None = None) -> None:
        self.lock_dir = lock_dir
        self.gpu_queue = gpu_queue

    async def pool(self) -> dict[str, Any]:
        view = await asyncio.to_thread(pool_view, self.lock_dir)  # NVML and files: off the loop
        if self.gpu_queue is not None:
            view.update(await self.gpu_queue.view())
        return view

    async def usage(self, since: float) -> dict[str, Any]:
        return await asyncio.to_thread(usage_view, self.lock_dir, since)

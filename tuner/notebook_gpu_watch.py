"""Notebook servers' GPU use on one machine, measured by the tuner service.

The hub's spawner records each GPU a notebook server holds (:mod:`tunehub_base.gpu_holders`);
the tuner service, the platform's process that already reads those records and NVML, measures
those GPUs as it measures its trials' (:class:`tuner.backends.local.gpu_watch.GpuWatch`), and
keeps the figures with the notebook's holding: so ``tunehub usage`` and the metrics count a
notebook's GPU-hours *used* beside those allocated, and the pool shows its ``use``. A notebook
that holds a GPU without using it past the grace period is named in the service's log. Giving
an idle GPU back is the notebook server's own doing, in both modes (it measures its GPUs itself:
:mod:`hub.singleuser.gpu_reclaim`, then the hub stops it: :mod:`hub.gpu_reclaim`).

Nothing here reads a person's files: the records are the platform's, NVML is the driver's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from tunehub_base.gpu_holders import HolderBook
from tunehub_base.gpus import GpuPool, discover_gpus
from tuner.backends.local.gpu_watch import GpuWatch

log = logging.getLogger("tunehub.notebook_gpus")


class NotebookGpuWatch:
    """Follows the notebook holdings of a lock directory: each one measured while it lasts."""

    def __init__(self, lock_dir: Path, interval: float | None = None) -> None:
        ids = discover_gpus()[0]
        self.ids = ids
        self.book = HolderBook(lock_dir)
        self.meter = GpuWatch(GpuPool(lock_dir, ids), interval=interval, holder="notebook")
        self._watched: set[str] = set()  # holding ids
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.ids and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.meter.close()

    async def _loop(self) -> None:
        while True:
            try:
                await self.follow()
            except Exception:  # measuring must never stop the service
                log.exception("notebooks' GPU use not followed this time")
            await asyncio.sleep(self.meter.interval)  # the sampling period

    async def follow(self) -> None:
        """Watch the notebook holdings that began, stop watching those that ended."""
        rows = await asyncio.to_thread(self.book.pool, self.ids)
        now: dict[str, tuple[str, str]] = {}  # holding id -> (gpu, what)
        for row in rows:
            holder = row.get("holder") or {}
            if holder.get("kind") == "notebook" and row.get("holding"):
                now[row["holding"]] = (row["gpu"], holder.get("what") or "a notebook")
        for holding in self._watched - set(now):
            self.meter.end(holding)
        for holding, (gpu, what) in now.items():
            if holding not in self._watched:
                self.meter.watch(holding, {gpu: holding}, _logger(what))
        self._watched = set(now)


def _logger(what: str) -> Callable[[str], None]:
    """Where a notebook's notes go: the service's log, naming the notebook."""
    def note(text: str) -> None:
        log.warning("%s: %s", what, text.strip().removeprefix("tunehub: "))
    return note

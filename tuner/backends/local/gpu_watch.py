"""The measured use of the GPUs local attempts hold: NVML read every
``TUNEHUB_GPU_SAMPLE_SECONDS`` for the GPUs of the attempts running, summed per attempt and GPU
(:class:`tunehub_base.gpu_meter.UseMeter`), kept in the GPUs' holder records (so ``sweep
show``, the Sweeps page and ``tunehub usage`` read it, and it ends in the GPU-hours ledger), and
said in the trial's log when an attempt holds a GPU it does not use.

The tuner reads NVML itself: it is the process that holds the GPUs' records, and NVML is the
driver's, not a path a person controls. One loop per backend, running while attempts hold GPUs;
the NVML calls run on a thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tunehub_base.gpu_meter import UseMeter, UsePolicy, number_setting
from tunehub_base.gpu_usage import Sampler
from tunehub_base.gpus import GpuPool

log = logging.getLogger("tunehub.gpu_watch")


@dataclass
class Watched:
    """One attempt's GPUs: the holding of each, its meter, and how to add a line to its log."""

    note: Callable[[str], None]
    holdings: dict[str, str]  # gpu -> holding id
    meters: dict[str, UseMeter] = field(default_factory=dict)
    unused: list[str] = field(default_factory=list)  # GPUs flagged as not used


class GpuWatch:
    def __init__(self, pool: GpuPool, interval: float | None = None,
                 policy: UsePolicy | None = None, holder: str = "attempt") -> None:
        self.pool = pool
        self.holder = holder  # what the notes call the holder: "this attempt" ...
        self.interval = max(0.1, interval if interval is not None
                            else number_setting("TUNEHUB_GPU_SAMPLE_SECONDS"))
        self.policy = policy or UsePolicy.from_env()
        self.sampler = Sampler()
        self._watched: dict[object, Watched] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self, key: object, gpus: list[str], note: Callable[[str], None]) -> None:
        """Measure the GPUs an attempt (``key``) was given until :meth:`end`."""
        self.watch(key, self.pool.holdings(gpus), note)

    def watch(self, key: object, holdings: dict[str, str], note: Callable[[str], None]) -> None:
        """Measure the GPUs of ``holdings`` (GPU id -> holding id) until :meth:`end`."""
        if not holdings:
            return
        now = time.time()
        self._watched[key] = Watched(note, holdings, {
            gpu: UseMeter(gpu, since=now) for gpu in holdings})
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def end(self, key: object) -> None:
        """The attempt ended (its GPUs not yet released): its figures are kept with its
        holdings, and its log says if it never used its GPUs."""
        watched = self._watched.pop(key, None)
        if watched is None:
            return
        self._keep(watched)
        if watched.unused:
            held = max(time.time() - m.since for m in watched.meters.values())
            self._note(watched, f"this {self.holder} held GPU {', '.join(watched.unused)} for "
                       f"{held:.0f} s and never used it ({self.policy.describe()} or more)")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.sampler.close)

    async def _loop(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval)  # the sampling period, not a wait for an event
            try:
                await self.tick()
            except Exception:  # measuring must never stop trials
                log.exception("GPU use not measured this time")

    async def tick(self) -> None:
        """One reading of every watched GPU, counted for their attempts."""
        gpus = sorted({g for w in self._watched.values() for g in w.holdings})
        if not gpus:
            return
        readings = await asyncio.to_thread(self.sampler.sample, gpus)
        now = time.time()
        for watched in list(self._watched.values()):
            for gpu, meter in watched.meters.items():
                if gpu in readings:  # else: its attempt started during this reading
                    meter.add(readings[gpu], now, self.policy)
            self._keep(watched)
            unused = sorted(g for g, m in watched.meters.items() if m.unused(self.policy))
            if unused and unused != watched.unused:
                self._note(watched, f"GPU {', '.join(unused)} of this {self.holder} is not used: "
                           f"{self.policy.describe()}. Does the code run on the CPU? (The GPU "
                           f"stays held for this {self.holder} until it ends.)")
            for gpu in sorted(set(watched.unused) - set(unused)):
                self._note(watched, f"GPU {gpu} of this {self.holder} is in use now")
            watched.unused = unused

    def _keep(self, watched: Watched) -> None:
        for gpu, holding in watched.holdings.items():
            try:
                self.pool.book.measured(gpu, holding, watched.meters[gpu].to_json(self.policy))
            except OSError as exc:
                log.warning("GPU %s: measured use not kept: %s", gpu, exc)

    @staticmethod
    def _note(watched: Watched, text: str) -> None:
        try:
            watched.note(f"tunehub: {text}\n")
        except OSError as exc:
            log.warning("trial log: %s", exc)

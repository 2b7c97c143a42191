"""A Kubernetes trial pod's measured GPU use, from the readings it reports, into its holding.

Why here and not from NVML: the tuner cannot read another node's GPUs. Each trial pod reads
its own (:mod:`tuner.sdk.gpu_report`) and posts them with its trial's token; the controller
running the attempt sums them per GPU (:class:`tunehub_base.gpu_meter.UseMeter`). This module
turns those meters into one pod's ``use`` (the field names of a holder's ``use`` on one
machine, summed over the pod's GPUs, each GPU's own under ``gpus``) and writes it into the
pod's row of ``tunehub_gpu_holdings`` (:meth:`.kube_ledger.KubeHoldingLedger.measured`), where
every tuner replica's pool view, ``GET usage`` and metrics read it.

Writes are coalesced: a pod reports every ``TUNEHUB_GPU_SAMPLE_SECONDS``; only its latest
sum waits to be written, by one task off the event loop, so a slow database delays the figures
and never the trial's reports.

Notebook pods' servers report their readings to the hub (:mod:`hub.gpu_reclaim`, the idle-GPU
rule); the tuner reads them from there into the same rows, summed the same way
(:mod:`.kube_notebook_use`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from tunehub_base.gpu_meter import UseMeter, UsePolicy, number_setting
from tuner.pool_sources.kube_ledger import KubeHoldingLedger

log = logging.getLogger("tunehub.pool")
STALE_SAMPLES = 3  # readings missed before a pod's figures count as old
NOT_MEASURED = "no reading from the pod yet"
NOTEBOOK = "no report from the notebook's server yet (read from the hub)"


def pod_use(meters: Mapping[str, UseMeter], policy: UsePolicy) -> dict[str, Any]:
    """One pod's use: GPU-seconds measured, used and busy summed over its GPUs (so used
    GPU-hours sit beside allocated ones, which count each GPU), peak memory of any one GPU,
    ``unused`` when any GPU it was given went unused, and each GPU's figures."""
    each = {gpu: meter.to_json(policy) for gpu, meter in sorted(meters.items())}
    last_at = [u["last_at"] for u in each.values() if u["last_at"] is not None]
    absent = sorted({str(u["absent"]) for u in each.values() if u["absent"]})
    return {
        "measured_seconds": sum(u["measured_seconds"] for u in each.values()),
        "used_seconds": sum(u["used_seconds"] for u in each.values()),
        "busy_seconds": sum(u["busy_seconds"] for u in each.values()),
        "ever_busy": any(u["ever_busy"] for u in each.values()),
        "unused": any(u["unused"] for u in each.values()),
        "peak_memory_bytes": max((u["peak_memory_bytes"] for u in each.values()), default=0),
        "samples": max((u["samples"] for u in each.values()), default=0),
        "last_at": max(last_at) if last_at else None,
        "absent": "; ".join(absent) or None,
        "gpus": each,
    }


def row_figures(use: dict[str, Any] | None, kind: str | None, now: float) -> dict[str, Any]:
    """What a pool row shows of its pod now, as one machine's rows do: ``utilization`` (the
    mean of its GPUs' latest readings), memory used and total (summed), the pids, or
    ``measure_absent`` saying why not (never measured, no figures, or readings too old)."""
    figures: dict[str, Any] = {"utilization": None, "memory_used_bytes": None,
                               "memory_total_bytes": None, "pids": [], "use": use,
                               "measured_at": None}
    if use is None:
        figures["measure_absent"] = NOTEBOOK if kind == "notebook" else NOT_MEASURED
        return figures
    last_at = use.get("last_at")
    figures["measured_at"] = last_at
    old = STALE_SAMPLES * max(1.0, number_setting("TUNEHUB_GPU_SAMPLE_SECONDS")) + 5
    if last_at is None or now - float(last_at) > old:
        figures["measure_absent"] = f"no reading from the pod for over {old:g} s"
        return figures
    latest = [u.get("last") or {} for u in (use.get("gpus") or {}).values()]
    shown = [r for r in latest if r.get("utilization") is not None]
    if not shown:
        figures["measure_absent"] = use.get("absent") or "no utilisation figure"
        return figures
    figures.update(
        utilization=sum(float(r["utilization"]) for r in shown) / len(shown),
        memory_used_bytes=_sum(r.get("memory_used_bytes") for r in shown),
        memory_total_bytes=_sum(r.get("memory_total_bytes") for r in shown),
        pids=sorted({int(p) for r in shown for p in r.get("pids") or []}),
        measure_absent=None)
    return figures


def _sum(values: Any) -> int | None:
    known = [int(v) for v in values if v is not None]
    return sum(known) if known else None


class PodUseWriter:
    """Keeps the latest use of each attempt and writes it to the ledger off the loop."""

    def __init__(self, ledger: KubeHoldingLedger) -> None:
        self.ledger = ledger
        self._pending: dict[tuple[int, int, int], dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None

    def measured(self, sweep_id: int, trial: int, attempt: int,
                 meters: Mapping[str, UseMeter]) -> None:
        """The attempt's meters after a reading (called on the event loop)."""
        self._pending[(sweep_id, trial, attempt)] = pod_use(meters, UsePolicy.from_env())
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(),
                                                                name="k8s-gpu-use")

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                await asyncio.to_thread(self._write, batch)
            except Exception:  # noqa: BLE001 - figures wait for the next reading
                log.exception("measured GPU use of trial pods not written this time")

    def _write(self, batch: dict[tuple[int, int, int], dict[str, Any]]) -> None:
        for (sweep_id, trial, attempt), use in batch.items():
            self.ledger.measured(sweep_id, trial, attempt, use)

    async def close(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

"""A Kubernetes notebook pod's measured GPU use, from the reports its server sends the hub.

Why from the hub: a GPU notebook server already reads its own GPUs (NVML, in its pod) and
reports every reading to the hub for the idle-GPU rule (:mod:`hub.singleuser.gpu_reclaim`,
:mod:`hub.gpu_reclaim`). Rather than have the server report twice, the tuner, which keeps the
cluster's GPU-hours (:mod:`.kube_ledger`), reads those reports from the hub with its own token
(``GET /hub/api/tunehub/gpu-use/<person>``, scope ``read:users:activity``, granted by
:func:`hub.scopes.tuner_service_role`) every ``TUNEHUB_GPU_SAMPLE_SECONDS``, one request per
person holding a GPU notebook pod.

The sums live in the holding's row, not in this process: each round takes a notebook's row
(its use so far, each GPU's meter under ``gpus``), adds the server's latest report when it is
newer than the last one counted (the hub's time of the report), and writes the row back. So a
restarted tuner goes on from the row, and several tuner replicas reading the same report
write the same figures instead of counting it twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

import httpx

from tunehub_base.gpu_meter import UseMeter, UsePolicy, number_setting
from tunehub_base.gpu_usage import GpuReading
from tuner.pool_sources.kube_ledger import KubeHoldingLedger
from tuner.pool_sources.kube_use import pod_use

log = logging.getLogger("tunehub.pool")


def with_report(use: dict[str, Any] | None, report: dict[str, Any] | None,
                policy: UsePolicy, gpus: int) -> dict[str, Any] | None:
    """``use`` (a row's, or None) with the server's ``report`` counted, for at most ``gpus``
    GPUs (what the pod holds: the report is the person's server's, so it cannot count more);
    None when the report adds nothing (absent, malformed, or not newer than the row's)."""
    if not isinstance(report, dict) or not isinstance(report.get("at"), int | float):
        return None
    at = float(report["at"])
    kept = (use or {}).get("gpus") or {}
    meters = {gpu: UseMeter.resumed(gpu, data, since=at) for gpu, data in kept.items()
              if isinstance(gpu, str) and isinstance(data, dict)}
    readings = []
    for item in report.get("readings") or []:
        try:
            readings.append(GpuReading.from_json(item))
        except ValueError:
            continue  # one bad reading never holds back the others
    if not readings or any(m.last_at is not None and m.last_at >= at for m in meters.values()):
        return None
    for reading in readings:
        meter = meters.get(reading.gpu)
        if meter is None:
            if len(meters) >= gpus:
                continue
            meter = meters[reading.gpu] = UseMeter(reading.gpu, since=at)
        meter.add(reading, at, policy)
    return pod_use(meters, policy)


class NotebookUseReader:
    """Reads the hub's reports of the notebook pods that hold GPUs into their rows."""

    def __init__(self, ledger: KubeHoldingLedger, api_url: str, token: str,
                 verify: object = True) -> None:
        """``api_url``, ``token``, ``verify``: the hub's API as the service reaches it
        (:class:`tuner.scheduling.hub_groups.HubGroups` has them)."""
        self.ledger = ledger
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.verify = verify
        self._failing = False

    async def run(self) -> None:
        """Every sampling period, until cancelled; a hub that does not answer is said once."""
        while True:
            try:
                await self.once()
                if self._failing:
                    log.info("notebook pods' GPU reports are read from the hub again")
                self._failing = False
            except (httpx.HTTPError, ValueError) as exc:
                if not self._failing:
                    log.warning("notebook pods' GPU use not read from the hub: %s (trying "
                                "again every sampling period)", exc)
                self._failing = True
            except Exception:  # noqa: BLE001 - measuring must never stop the service
                log.exception("notebook pods' GPU use not read this time")
            await asyncio.sleep(max(1.0, number_setting("TUNEHUB_GPU_SAMPLE_SECONDS")))

    async def once(self) -> int:
        """One round: returns how many rows took a newer report."""
        holdings = await asyncio.to_thread(self.ledger.open_notebooks)
        if not holdings:
            return 0
        policy = UsePolicy.from_env()
        written = 0
        async with httpx.AsyncClient(verify=self.verify, timeout=10) as client:  # type: ignore[arg-type]
            for person in sorted({person for _, person, _, _, _ in holdings}):
                r = await client.get(f"{self.api_url}/tunehub/gpu-use/{quote(person, safe='')}",
                                     headers={"Authorization": f"token {self.token}"})
                if r.status_code == 404:
                    continue  # no such person on the hub (any more)
                r.raise_for_status()
                servers = r.json().get("servers") or {}
                for uid, who, server, gpus, use in holdings:
                    if who != person:
                        continue
                    newer = with_report(use, servers.get(server), policy, gpus)
                    if newer is not None and await asyncio.to_thread(
                            self.ledger.measured_pod, uid, newer):
                        written += 1
        return written

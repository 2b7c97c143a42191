"""GPU-hours on Kubernetes: one row per pod that held GPUs, in the tuner's database
(``tunehub_gpu_holdings``, :class:`tuner.db.models.GpuHolding`).

Why the database and not a file as on one machine: on a cluster the tuner has no directory it
shares with the hub (the lock directory's ``ledger.jsonl`` exists because the hub and the
tuner share that directory and nothing else), but it has its database, which every tuner
replica shares and which outlives pods; the pods themselves go (a Job's after its TTL, a
notebook's when it stops), so what they held must be written down while they are seen.

Written by :mod:`.kube_recorder` from the pod watch: a row opened when a pod is first seen
holding GPUs, closed when it finishes or goes. Each write is idempotent (the pod's uid is
unique, a close touches only an open row), so several tuners watching write each holding
once. Rows are plain calls here; the recorder runs them off the event loop.

Each trial pod's measured use (:mod:`.kube_use`) is written into its row by the tuner that
takes the pod's readings (:meth:`KubeHoldingLedger.measured`): the row is where every replica's
pool view and GPU-hours read it, and a reading carries the attempt's whole sum so far, so the
latest write is the truth and a lost one is mended by the next.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from tunehub_base.gpu_holders import Holder
from tuner.db import Database
from tuner.db.models import GpuHolding


class KubeHoldingLedger:
    """The holdings table of one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def opened(self, uid: str, pod: str, holder: Holder, gpus: int, flavor: str | None,
               start: float, end: float | None = None) -> bool:
        """Record the pod's holding (closed at once when ``end`` is known: a pod seen only
        after it finished). False if it was recorded already."""
        try:
            with self.db.session() as s:
                s.add(GpuHolding(
                    pod_uid=uid, pod=pod, person=holder.person, kind=holder.kind,
                    server=holder.server, sweep_id=holder.sweep_id, trial=holder.trial,
                    attempt=holder.attempt, gpus=gpus, flavor=flavor, start=start,
                    groups=list(holder.groups) or None,
                    end=None if end is None else max(end, start), stale=False))
            return True
        except IntegrityError:
            return False

    def closed(self, uid: str, end: float, stale: bool = False) -> bool:
        """End the pod's open holding at ``end``; False when none is open."""
        with self.db.session() as s:
            result = s.execute(update(GpuHolding).where(
                GpuHolding.pod_uid == uid, GpuHolding.end.is_(None)).values(end=end, stale=stale))
            return bool(getattr(result, "rowcount", 0))

    def measured(self, sweep_id: int, trial: int, attempt: int, use: dict[str, Any]) -> bool:
        """Keep a trial attempt's measured use so far in its pod's row; False when that row
        is not recorded yet (the next reading writes it)."""
        with self.db.session() as s:
            result = s.execute(update(GpuHolding).where(
                GpuHolding.kind == "trial", GpuHolding.sweep_id == sweep_id,
                GpuHolding.trial == trial, GpuHolding.attempt == attempt).values(
                used_seconds=float(use.get("used_seconds") or 0.0), use=use))
            return bool(getattr(result, "rowcount", 0))

    def open_notebooks(self) -> list[tuple[str, str, str, int, dict[str, Any] | None]]:
        """Each notebook pod holding GPUs now: its uid, person, server, GPUs and use so far."""
        with self.db.session() as s:
            rows = s.execute(select(GpuHolding.pod_uid, GpuHolding.person, GpuHolding.server,
                                    GpuHolding.gpus, GpuHolding.use).where(
                GpuHolding.kind == "notebook", GpuHolding.end.is_(None))).all()
        return [(uid, person, server or "", int(gpus), use if isinstance(use, dict) else None)
                for uid, person, server, gpus, use in rows]

    def measured_pod(self, uid: str, use: dict[str, Any]) -> bool:
        """Keep a pod's measured use so far in its row (a notebook's: by its uid, which the
        reader of its reports has); False when the row is gone or closed."""
        with self.db.session() as s:
            result = s.execute(update(GpuHolding).where(
                GpuHolding.pod_uid == uid, GpuHolding.end.is_(None)).values(
                used_seconds=float(use.get("used_seconds") or 0.0), use=use))
            return bool(getattr(result, "rowcount", 0))

    def uses(self, uids: list[str]) -> dict[str, dict[str, Any]]:
        """The measured use of the pods ``uids`` that have one."""
        if not uids:
            return {}
        with self.db.session() as s:
            rows = s.execute(select(GpuHolding.pod_uid, GpuHolding.use).where(
                GpuHolding.pod_uid.in_(uids), GpuHolding.use.is_not(None))).all()
        return {uid: use for uid, use in rows if isinstance(use, dict)}

    def totals(self, now: float) -> list[tuple[str, str, float, float]]:
        """All time, per person and kind: GPU-seconds allocated (open holdings up to now)
        and used as measured, for the metrics' counters."""
        held = GpuHolding.gpus * (func.coalesce(GpuHolding.end, now) - GpuHolding.start)
        with self.db.session() as s:
            rows = s.execute(select(GpuHolding.person, GpuHolding.kind, func.sum(held),
                                    func.sum(GpuHolding.used_seconds)).group_by(
                GpuHolding.person, GpuHolding.kind)).all()
        return [(str(p), str(k), max(0.0, float(a or 0)), float(u or 0)) for p, k, a, u in rows]

    def open_uids(self) -> set[str]:
        with self.db.session() as s:
            return set(s.scalars(select(GpuHolding.pod_uid).where(GpuHolding.end.is_(None))))

    def spans(self, since: float, now: float) -> list[dict[str, Any]]:
        """The holdings that overlap ``since``..``now``, open ones ending now, as the spans
        :func:`tunehub_base.gpu_holders.usage_report` sums."""
        with self.db.session() as s:
            rows = s.scalars(select(GpuHolding).where(
                (GpuHolding.end.is_(None)) | (GpuHolding.end > since),
                GpuHolding.start < now)).all()
        return [{"person": r.person, "kind": r.kind, "server": r.server,
                 "sweep_id": r.sweep_id, "trial": r.trial, "attempt": r.attempt,
                 "gpus": r.gpus, "flavor": r.flavor, "pod": r.pod, "start": r.start,
                 "end": now if r.end is None else r.end, "open": r.end is None,
                 "stale": r.stale, "use": r.use, "groups": list(r.groups or ())}
                for r in rows]

"""The GPU pool of this machine as the CLI, the service's API and its page show it: who holds
each GPU since when, what each GPU does now (NVML, :mod:`tunehub_base.gpu_usage`), and allocated
and used GPU-hours over a period (:mod:`tunehub_base.gpu_holders`); and a sweep's trials' measured
GPU use, for ``sweep show`` and the Sweeps page.

The pool is public inside the lab: every logged-in person sees every holder, and nothing here
changes anything."""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tunehub_base.gpu_holders import HolderBook, record_name
from tunehub_base.gpu_pod_use import PodUseBook
from tunehub_base.gpu_usage import sample
from tunehub_base.gpus import discover_gpus
from tuner.spec import SpecError

#: A holder's record among the lock directory's files, its GPU id the group.
RECORD = re.compile(re.escape(record_name("@")).replace("@", "(.+)"))


def pool_view(lock_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Each GPU of this machine: free or held, by whom (person, notebook or sweep/trial), since
    when, and what it does now: ``utilization`` (0..1), memory used and total, the pids on it,
    or ``measure_absent``, why there are no figures (then they are null)."""
    ids, source = discover_gpus()
    now = time.time() if now is None else now
    rows = HolderBook(lock_dir).pool(ids)
    readings = sample(ids)
    for row in rows:
        if row.get("since") is not None:
            row["since_iso"] = iso(row["since"])
            row["held_seconds"] = max(0.0, now - row["since"])
        reading = readings[row["gpu"]]
        row.update(utilization=reading.utilization,
                   memory_used_bytes=reading.memory_used_bytes,
                   memory_total_bytes=reading.memory_total_bytes, pids=list(reading.pids),
                   measure_absent=reading.absent)
    return {"mode": "local", "gpu_source": source, "total": len(ids),
            "held": sum(1 for r in rows if r["state"] == "held"), "gpus": rows}


def parse_since(text: str) -> float:
    """``2026-11-01`` or an ISO date and time (UTC unless it says otherwise), as seconds."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SpecError(
            "since", f"expected a date like 2026-11-01 or 2026-11-01T08:00, got {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def usage_view(lock_dir: Path, since: float, now: float | None = None) -> dict[str, Any]:
    """Allocated GPU-hours since ``since`` per person, hub group (where known), sweep and
    notebook, still-open holdings counted up to now; and beside them (``used``) the GPU-hours
    used as measured."""
    ids, _ = discover_gpus()
    report = HolderBook(lock_dir).usage(ids, since, now)
    report["since_iso"] = iso(report["since"])
    report["until_iso"] = iso(report["until"])
    report["mode"] = "local"
    return report


def trials_gpu_use(lock_dir: Path, sweep_id: int) -> dict[int, dict[str, Any]]:
    """Each trial's measured GPU use (trial number -> figures), from the holdings of its
    attempts (ended ones in the ledger, running ones in the records): GPU-seconds allocated and
    used (utilisation-weighted) over all its attempts, peak memory, and whether its latest
    attempt holds or held a GPU it does not use (``unused``, with ``unused_gpus``). Trials that
    held no GPU here are absent."""
    book = HolderBook(lock_dir)
    now = time.time()
    spans = [dict(s) for s in book.intervals()
             if s.get("kind") == "trial" and s.get("sweep_id") == sweep_id]
    spans += PodUseBook(lock_dir).spans(sweep_id)  # Kubernetes pods' own readings
    for row in book.pool(_recorded_gpus(lock_dir)):
        holder = row.get("holder") or {}
        if holder.get("kind") == "trial" and holder.get("sweep_id") == sweep_id:
            spans.append({**holder, "gpu": row["gpu"], "start": row["since"], "end": now,
                          "use": row.get("use"), "open": True})
    by_trial: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        if isinstance(span.get("trial"), int):
            by_trial[span["trial"]].append(span)
    return {number: _trial_use(trial_spans) for number, trial_spans in by_trial.items()}


def _recorded_gpus(lock_dir: Path) -> list[str]:
    """The GPUs that have a holder's record now: what a sweep's running attempts can hold,
    found without asking NVML (this runs on the API's event loop)."""
    try:
        names = os.listdir(lock_dir)
    except OSError:
        return []
    return sorted(m.group(1) for m in map(RECORD.fullmatch, names) if m)


def _trial_use(spans: list[dict[str, Any]]) -> dict[str, Any]:
    latest = max(int(s.get("attempt") or 0) for s in spans)
    last = [s for s in spans if int(s.get("attempt") or 0) == latest]
    uses = [s["use"] for s in spans if isinstance(s.get("use"), dict)]
    last_uses = {str(s["gpu"]): s["use"] for s in last if isinstance(s.get("use"), dict)}
    absent = sorted({str(u["absent"]) for u in last_uses.values() if u.get("absent")})
    unused = sorted(gpu for gpu, use in last_uses.items() if use.get("unused"))
    return {
        "attempt": latest,
        "gpus": sorted(str(s["gpu"]) for s in last),
        "holding": any(s.get("open") for s in last),
        "allocated_seconds": sum(max(0.0, float(s["end"]) - float(s["start"])) for s in spans),
        "measured_seconds": sum(float(u.get("measured_seconds") or 0) for u in uses),
        "used_seconds": sum(float(u.get("used_seconds") or 0) for u in uses),
        "peak_memory_bytes": max((int(u.get("peak_memory_bytes") or 0) for u in uses),
                                 default=None),
        "unused": bool(unused),
        "unused_gpus": unused,
        "absent": "; ".join(absent) or (None if last_uses else "not measured"),
    }

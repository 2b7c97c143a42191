"""The GPU pool of this machine as the CLI, the service's API and its page show it: who holds
each GPU since when, and allocated GPU-hours over a period (:mod:`tunehub_base.gpu_holders`).

The pool is public inside the lab: every logged-in person sees every holder, and nothing here
changes anything."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tunehub_base.gpu_holders import HolderBook
from tunehub_base.gpus import discover_gpus
from tuner.spec import SpecError


def pool_view(lock_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Each GPU of this machine: free or held, by whom (person, notebook or sweep/trial), since
    when; ``utilization`` is null until measured."""
    ids, source = discover_gpus()
    now = time.time() if now is None else now
    rows = HolderBook(lock_dir).pool(ids)
    for row in rows:
        if row.get("since") is not None:
            row["since_iso"] = iso(row["since"])
            row["held_seconds"] = max(0.0, now - row["since"])
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
    notebook, still-open holdings counted up to now."""
    ids, _ = discover_gpus()
    report = HolderBook(lock_dir).usage(ids, since, now)
    report["since_iso"] = iso(report["since"])
    report["until_iso"] = iso(report["until"])
    return report

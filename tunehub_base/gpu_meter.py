"""A holding's measured GPU use, summed from readings (:mod:`tunehub_base.gpu_usage`), and the
rule that says a holder never used the GPU it was given.

Each reading stands for the time since the previous one (since the holding began, for the
first): that time counts as *measured*, and times the utilisation as GPU-seconds *used*. A
holder is **unused** once it has been measured for the grace period and no reading ever saw a
process on the GPU or utilisation at the threshold: the common, costly mistake of a trial that
asked for a GPU and trains on the CPU. Readings without figures (no NVML, a lost GPU) count as
neither: an unmeasured GPU is never called unused.

The figures are kept in the holding's record (:meth:`tunehub_base.gpu_holders.HolderBook.
measured`) as :meth:`UseMeter.to_json` gives them, and end in the GPU-hours ledger with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tunehub_base.gpu_usage import GpuReading
from tunehub_base.options import setting


@dataclass(frozen=True)
class UsePolicy:
    """When a GPU counts as used, and how long a holder may go without using it."""

    grace_seconds: float = 120.0
    busy_threshold: float = 0.05  # utilisation, 0..1

    @classmethod
    def from_env(cls) -> UsePolicy:
        """``TUNEHUB_GPU_IDLE_GRACE_SECONDS`` and ``TUNEHUB_GPU_BUSY_PERCENT``."""
        return cls(grace_seconds=number_setting("TUNEHUB_GPU_IDLE_GRACE_SECONDS"),
                   busy_threshold=number_setting("TUNEHUB_GPU_BUSY_PERCENT") / 100)

    def describe(self) -> str:
        return (f"no process on it and utilisation under {self.busy_threshold:.0%} for "
                f"{self.grace_seconds:g} s")


def number_setting(env: str) -> float:
    """A non-negative number setting (fractions allowed); its default where unset or bad."""
    item = setting(env)
    try:
        value = float(item.read() or "nan")
    except ValueError:
        value = float("nan")
    if not value >= 0:  # also NaN: unset or not a number
        value = float(str(item.value))
    return value


@dataclass
class UseMeter:
    """One holding's use of one GPU, from its start (``since``) on."""

    gpu: str
    since: float
    measured_seconds: float = 0.0
    used_seconds: float = 0.0  # utilisation-weighted
    busy_seconds: float = 0.0
    ever_busy: bool = False
    peak_memory_bytes: int = 0
    memory_total_bytes: int | None = None
    samples: int = 0
    last_at: float | None = None
    last: dict[str, Any] | None = None  # the latest reading
    absent: str | None = None  # why the latest reading had no figures

    @classmethod
    def resumed(cls, gpu: str, kept: dict[str, Any], since: float) -> UseMeter:
        """The meter whose :meth:`to_json` was ``kept`` (taken up where it stopped: by another
        process, or after a restart); fields that are missing or wrong start afresh, and a
        meter with no reading time counts from ``since``."""
        meter = cls(gpu, since=_number(kept.get("last_at")) or since)
        for name in ("measured_seconds", "used_seconds", "busy_seconds"):
            setattr(meter, name, _number(kept.get(name)) or 0.0)
        meter.peak_memory_bytes = int(_number(kept.get("peak_memory_bytes")) or 0)
        total = _number(kept.get("memory_total_bytes"))
        meter.memory_total_bytes = None if total is None else int(total)
        meter.samples = int(_number(kept.get("samples")) or 0)
        meter.last_at = _number(kept.get("last_at"))
        meter.ever_busy = kept.get("ever_busy") is True
        meter.last = kept.get("last") if isinstance(kept.get("last"), dict) else None
        meter.absent = kept.get("absent") if isinstance(kept.get("absent"), str) else None
        return meter

    def add(self, reading: GpuReading, now: float, policy: UsePolicy) -> None:
        """Count ``reading``, taken at ``now``, for the time since the previous one."""
        span = max(0.0, now - (self.last_at if self.last_at is not None else self.since))
        self.last_at = now
        self.samples += 1
        self.last = reading.to_json()
        busy = reading.busy(policy.busy_threshold)
        if busy is None:
            self.absent = reading.absent or "no utilisation figure"
            return
        self.absent = None
        self.measured_seconds += span
        self.used_seconds += span * (reading.utilization or 0.0)
        if busy:
            self.busy_seconds += span
            self.ever_busy = True
        self.peak_memory_bytes = max(self.peak_memory_bytes, reading.memory_used_bytes or 0)
        if reading.memory_total_bytes is not None:
            self.memory_total_bytes = reading.memory_total_bytes

    def unused(self, policy: UsePolicy) -> bool:
        """Measured for the grace period and never in use."""
        return not self.ever_busy and self.measured_seconds >= policy.grace_seconds

    def to_json(self, policy: UsePolicy) -> dict[str, Any]:
        return {"measured_seconds": self.measured_seconds, "used_seconds": self.used_seconds,
                "busy_seconds": self.busy_seconds, "ever_busy": self.ever_busy,
                "unused": self.unused(policy), "peak_memory_bytes": self.peak_memory_bytes,
                "memory_total_bytes": self.memory_total_bytes, "samples": self.samples,
                "last_at": self.last_at, "last": self.last, "absent": self.absent}


def _number(value: Any) -> float | None:
    """``value`` if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None

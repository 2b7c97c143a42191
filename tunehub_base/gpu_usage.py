"""What the GPUs a process was given actually do, read from NVML (``nvidia-ml-py``).

One reader for every holder: the tuner for its trials' GPUs, the pool view and metrics for all
of this machine's, and (later) a notebook server or a pod for its own. Given tunehub's GPU ids
(what ``CUDA_VISIBLE_DEVICES`` holds: NVML indices, or ``GPU-...`` UUIDs), it answers per GPU
its utilisation, memory used and total, and the pids of the processes computing on it, or why
there are no figures ("no NVML library", "GPU lost", ...). It never raises: a machine without a
GPU, a driver that went away or a GPU that fell off the bus is a reading with a reason.

NVML's pids are those of the machine's (in a container: the host's) process namespace.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tunehub.gpu_usage")

NO_MODULE = "no NVML: the nvidia-ml-py package is not installed"
NO_LIBRARY = "no NVML library (libnvidia-ml.so.1): no NVIDIA driver on this machine"
LOST = "GPU lost (NVML: the GPU has fallen off the bus or is otherwise inaccessible)"


@dataclass(frozen=True)
class GpuReading:
    """One GPU's figures at one moment, or ``absent``: why there are none."""

    gpu: str
    utilization: float | None = None  # 0..1, over NVML's last sample period
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    pids: tuple[int, ...] = ()
    absent: str | None = None
    name: str | None = None

    def busy(self, threshold: float) -> bool | None:
        """In use (some process computes on it, or its utilisation reaches ``threshold``);
        None when there are no figures to tell."""
        if self.absent is not None or self.utilization is None:
            return None
        return bool(self.pids) or self.utilization >= threshold

    @classmethod
    def from_json(cls, data: Any) -> GpuReading:
        """A reading another process sent (a pod's): checked field by field; ValueError names
        the field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError("reading: not an object")
        gpu = data.get("gpu")
        if not isinstance(gpu, str) or not 0 < len(gpu) <= 64:
            raise ValueError("gpu: a GPU id of 1 to 64 characters")
        util = data.get("utilization")
        if util is not None and (isinstance(util, bool) or not isinstance(util, int | float)
                                 or not 0 <= util <= 1):
            raise ValueError("utilization: a number from 0 to 1, or null")
        for field_ in ("memory_used_bytes", "memory_total_bytes"):
            v = data.get(field_)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{field_}: a non-negative integer, or null")
        pids = data.get("pids", [])
        if not isinstance(pids, list) or len(pids) > 256 or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pids):
            raise ValueError("pids: a list of at most 256 process ids")
        for field_ in ("absent", "name"):
            v = data.get(field_)
            if v is not None and (not isinstance(v, str) or len(v) > 300):
                raise ValueError(f"{field_}: a string of at most 300 characters, or null")
        return cls(gpu, None if util is None else float(util),
                   memory_used_bytes=data.get("memory_used_bytes"),
                   memory_total_bytes=data.get("memory_total_bytes"), pids=tuple(pids),
                   absent=data.get("absent"), name=data.get("name"))

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "utilization": self.utilization,
                "memory_used_bytes": self.memory_used_bytes,
                "memory_total_bytes": self.memory_total_bytes, "pids": list(self.pids),
                "absent": self.absent, "name": self.name}


def absent(gpu_ids: list[str], reason: str) -> dict[str, GpuReading]:
    return {gpu: GpuReading(gpu, absent=reason) for gpu in gpu_ids}


@dataclass
class Sampler:
    """Reads NVML, initialising it once and again after a failure (``nvmlInit`` can take a
    second on a machine without persistence mode: a sampler that runs every few seconds keeps
    it). Thread-safe: one reading at a time."""

    _ready: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, gpu_ids: list[str]) -> dict[str, GpuReading]:
        """Each of ``gpu_ids``' reading (every id gets one)."""
        with self._lock:
            try:
                return self._sample(list(gpu_ids))
            except Exception as exc:  # never raises to its caller: the reading says why
                log.warning("NVML reading failed: %s", exc)
                self._shutdown()
                return absent(gpu_ids, f"NVML failed: {exc}")

    def close(self) -> None:
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        if not self._ready:
            return
        self._ready = False
        try:
            import pynvml

            pynvml.nvmlShutdown()
        except Exception:
            pass

    def _sample(self, gpu_ids: list[str]) -> dict[str, GpuReading]:
        try:
            import pynvml
        except ImportError:
            return absent(gpu_ids, NO_MODULE)
        if not self._ready:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError_LibraryNotFound:
                return absent(gpu_ids, NO_LIBRARY)
            except pynvml.NVMLError as exc:
                return absent(gpu_ids, f"NVML not available: {exc}")
            self._ready = True
        readings = {gpu: _read(pynvml, gpu) for gpu in gpu_ids}
        if any(r.absent == LOST for r in readings.values()):
            self._shutdown()  # a lost GPU: NVML afresh next time
        return readings


def _reason(pynvml: Any, exc: Exception) -> str:
    if getattr(exc, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
        return LOST
    return f"NVML: {exc}"


def _handle(pynvml: Any, gpu: str) -> Any:
    """The NVML device of a tunehub GPU id: an index, or a UUID as ``CUDA_VISIBLE_DEVICES``
    may name it; None if NVML has no such device."""
    if gpu.isdigit():
        index = int(gpu)
        return pynvml.nvmlDeviceGetHandleByIndex(index) \
            if index < pynvml.nvmlDeviceGetCount() else None
    for index in range(pynvml.nvmlDeviceGetCount()):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError:
            continue  # another GPU, lost: not the one asked for
        if (uuid.decode() if isinstance(uuid, bytes) else uuid) == gpu:
            return handle
    return None


def _read(pynvml: Any, gpu: str) -> GpuReading:
    try:
        handle = _handle(pynvml, gpu)
        if handle is None:
            return GpuReading(gpu, absent=f"NVML has no GPU {gpu}")
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        name = pynvml.nvmlDeviceGetName(handle)
    except pynvml.NVMLError as exc:
        return GpuReading(gpu, absent=_reason(pynvml, exc))
    return GpuReading(
        gpu, utilization=min(1.0, max(0.0, util.gpu / 100)),
        memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
        pids=tuple(sorted({int(p.pid) for p in procs})),
        name=name.decode(errors="replace") if isinstance(name, bytes) else str(name))


def nvml_gpus() -> list[str] | None:
    """The indices of every GPU NVML shows this process (in a pod: the pod's own, as its
    container runtime exposes them); None when NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def sample(gpu_ids: list[str]) -> dict[str, GpuReading]:
    """One reading of ``gpu_ids`` (NVML initialised and shut down again): for a page or a
    scrape; a loop uses a :class:`Sampler` of its own."""
    sampler = Sampler()
    try:
        return sampler.sample(gpu_ids)
    finally:
        sampler.close()

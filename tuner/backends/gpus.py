"""Whole-GPU allocation on one machine.

Each GPU is a lock file held (``flock``) for as long as a trial uses it, so two sweeps driven by
two different processes still never share a GPU, and a crashed holder frees its GPUs at once.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

ENV_LOCAL_GPUS = "TUNEHUB_LOCAL_GPUS"


def discover_gpus() -> tuple[list[str], str]:
    """The GPU ids trials may use, and where that list came from (for error messages).

    ``TUNEHUB_LOCAL_GPUS`` (e.g. ``0,1``; empty for none) restricts tunehub to some devices;
    otherwise NVML (``nvidia-ml-py``) counts them.
    """
    declared = os.environ.get(ENV_LOCAL_GPUS)
    if declared is not None:
        ids = [d.strip() for d in declared.split(",") if d.strip()]
        return ids, f"{ENV_LOCAL_GPUS}={declared!r}"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPUs
        return [], "no NVIDIA GPU found via NVML"
    return [str(i) for i in range(count)], f"{count} found via NVML"


class GpuPool:
    """Hands out whole GPUs by taking their lock files."""

    def __init__(self, lock_dir: Path, gpu_ids: list[str]) -> None:
        self.lock_dir = lock_dir
        self.gpu_ids = list(gpu_ids)
        self._held: dict[str, int] = {}  # gpu id -> open fd holding its lock

    @property
    def total(self) -> int:
        return len(self.gpu_ids)

    def acquire(self, count: int) -> list[str] | None:
        """Take ``count`` free GPUs, or none at all (``None``) if not enough are free."""
        if count == 0:
            return []
        taken: list[str] = []
        for gpu in self.gpu_ids:
            if gpu in self._held:
                continue
            self.lock_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_dir / f"gpu{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[gpu] = fd
            taken.append(gpu)
            if len(taken) == count:
                return taken
        self.release(taken)
        return None

    def release(self, gpus: list[str]) -> None:
        for gpu in gpus:
            fd = self._held.pop(gpu, None)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

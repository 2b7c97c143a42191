"""Whole-GPU allocation on one machine.

Each GPU is a lock file held (``flock``) for as long as a trial uses it, so two sweeps driven by
two different processes still never share a GPU, and a crashed holder frees its GPUs at once.
A holder that says who it is (``acquire(count, holder)``) is recorded, and its holding goes to
the GPU-hours ledger when released (:mod:`tunehub_base.gpu_holders`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from tunehub_base.gpu_holders import Holder, HolderBook

log = logging.getLogger("tunehub.gpus")

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
        self._holdings: dict[str, str] = {}  # gpu id -> id of its recorded holding
        self.book = HolderBook(lock_dir)

    @property
    def total(self) -> int:
        return len(self.gpu_ids)

    def acquire(self, count: int, holder: Holder | None = None) -> list[str] | None:
        """Take ``count`` free GPUs, or none at all (``None``) if not enough are free. With a
        ``holder``, each GPU taken is recorded as theirs (a probe that takes and gives back at
        once passes none)."""
        if count == 0:
            return []
        try:
            self.book.close_stale(self.gpu_ids)  # a dead holder's time ends here at the latest
        except OSError as exc:
            log.warning("GPU holders' records not checked: %s", exc)
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
                if holder is not None:
                    self._record(taken, holder)
                return taken
        self.release(taken)
        return None

    def _record(self, gpus: list[str], holder: Holder) -> None:
        for gpu in gpus:
            try:
                self._holdings[gpu] = self.book.taken(gpu, holder).id
            except OSError as exc:  # the pool's view suffers, never the allocation
                log.warning("GPU %s: holder not recorded: %s", gpu, exc)

    def holdings(self, gpus: list[str]) -> dict[str, str]:
        """The recorded holding of each of ``gpus`` (gpu id -> holding id), for a caller that
        detaches them and releases them later with :meth:`HolderBook.released`."""
        return {gpu: self._holdings[gpu] for gpu in gpus if gpu in self._holdings}

    def detach(self, gpus: list[str]) -> list[int]:
        """Hand the locks of ``gpus`` over: their descriptors, which the pool forgets without
        unlocking (a child process that inherits them holds the GPUs; the caller closes its
        own copies once it has). Their records stay: the new holder's, ended with
        :meth:`HolderBook.released` (see :meth:`holdings`)."""
        for gpu in gpus:
            self._holdings.pop(gpu, None)
        return [self._held.pop(gpu) for gpu in gpus]

    def release(self, gpus: list[str]) -> None:
        for gpu in gpus:
            fd = self._held.pop(gpu, None)
            holding = self._holdings.pop(gpu, None)
            if holding is not None and fd is not None:
                try:
                    self.book.released(gpu, holding)  # while still holding the lock
                except OSError as exc:
                    log.warning("GPU %s: release not in the ledger: %s", gpu, exc)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

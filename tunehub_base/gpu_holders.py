"""Who holds each GPU of this machine, since when, and the GPU-hours everyone was allocated.

The one owner of two files beside :class:`tunehub_base.gpus.GpuPool`'s lock files, in the
platform's own lock directory (``$TUNEHUB_HOME/gpu-locks``, root and 0700 under ``tunehub up`` as
root, so only the platform writes them):

``gpu<ID>.holder.json``
    Written by whoever just took ``gpu<ID>.lock`` (the hub's spawner for a notebook, the tuner's
    local backend for a trial): person, kind (``notebook`` | ``trial``), the server's name or the
    sweep, trial number and attempt, and since when. Replaced whole (a new file renamed over the
    old one), never followed: every open is ``O_NOFOLLOW`` relative to the directory opened once.

    The holder that measures its GPUs' use (:mod:`tunehub_base.gpu_meter`) rewrites the record
    with what it measured so far (``"use"``), so the record a holder leaves says what it did.

``ledger.jsonl``
    Append-only: one line per ended holding, ``{"gpu", "person", "kind", ..., "start", "end"}``
    and its measured ``"use"`` where it was measured.
    The holder that releases a GPU appends it; a holding whose holder died without releasing
    (its lock freed by the kernel, its record left behind) is closed by the platform's next
    allocation of any GPU (:meth:`HolderBook.close_stale`), at that moment (``"stale": true``:
    the real end lies somewhere before). Every change to records and ledger happens under the
    ledger's ``flock``, so a holding is closed exactly once.

Why a file and not a table in the tuner's database: the hub (notebooks) and the tuner (trials)
share the lock directory and nothing else on one machine; the hub never opens the tuner's
database. The ledger lives where the locks live, written by the same two processes.

Who holds a GPU is what the kernel says, not what a record says: a lock file is held while some
process holds its ``flock``, read from ``/proc/locks`` (never by trying the lock, which would make
a concurrent taker see the GPU busy). A record whose lock is free is a dead holder's: the GPU
reads free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LEDGER = "ledger.jsonl"
RECORD_BYTES = 64 * 1024
KINDS = ("notebook", "trial")


def lock_name(gpu: str) -> str:
    return f"gpu{gpu}.lock"


def record_name(gpu: str) -> str:
    return f"gpu{gpu}.holder.json"


@dataclass(frozen=True)
class Holder:
    """Who takes a GPU: a person's notebook server or one attempt of a sweep's trial."""

    person: str
    kind: str  # notebook | trial
    server: str | None = None  # notebook: the server's name ("" for the default one)
    sweep_id: int | None = None
    trial: int | None = None
    attempt: int | None = None
    groups: tuple[str, ...] = ()

    @classmethod
    def notebook(cls, person: str, server: str = "", groups: tuple[str, ...] = ()) -> Holder:
        return cls(person=person, kind="notebook", server=server, groups=tuple(groups))

    @classmethod
    def trial_attempt(cls, person: str, sweep_id: int, trial: int, attempt: int,
                      groups: tuple[str, ...] = ()) -> Holder:
        return cls(person=person, kind="trial", sweep_id=sweep_id, trial=trial, attempt=attempt,
                   groups=tuple(groups))

    @property
    def what(self) -> str:
        """The notebook or sweep/trial, for people."""
        if self.kind == "notebook":
            return f"notebook {self.person}/{self.server}" if self.server else \
                f"notebook of {self.person}"
        return f"sweep {self.sweep_id} trial {self.trial} attempt {self.attempt}"

    def view(self) -> dict[str, Any]:
        """The holder as the pool view shows it (in both modes): its fields and ``what``."""
        return {**asdict(self), "what": self.what, "groups": list(self.groups)}


@dataclass(frozen=True)
class Holding:
    """One holder's hold on one GPU: ``id`` tells this holding from a later one of the GPU."""

    gpu: str
    holder: Holder
    since: float
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    #: What the holder measured of its use so far (:class:`tunehub_base.gpu_meter.UseMeter`).
    use: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        raw = {"id": self.id, "gpu": self.gpu, "since": self.since,
               **{k: v for k, v in asdict(self.holder).items()}}
        if self.use is not None:
            raw["use"] = self.use
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Holding:
        holder = Holder(
            person=str(raw["person"]), kind=str(raw["kind"]), server=raw.get("server"),
            sweep_id=raw.get("sweep_id"), trial=raw.get("trial"), attempt=raw.get("attempt"),
            groups=tuple(str(g) for g in raw.get("groups") or ()))
        use = raw.get("use")
        return cls(gpu=str(raw["gpu"]), holder=holder, since=float(raw["since"]),
                   id=str(raw["id"]), use=use if isinstance(use, dict) else None)


class HolderBook:
    """The holder records and the ledger of one lock directory."""

    def __init__(self, lock_dir: Path, clock: Any = time.time) -> None:
        self.lock_dir = Path(lock_dir)
        self.clock = clock

    # --- files, never following a link -------------------------------------------------------

    def _dir_fd(self, create: bool = True) -> int:
        if create:
            self.lock_dir.mkdir(parents=True, exist_ok=True)
        return os.open(self.lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)

    def _read(self, name: str, dir_fd: int) -> bytes | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        try:
            return os.read(fd, RECORD_BYTES)
        finally:
            os.close(fd)

    def _record(self, gpu: str, dir_fd: int) -> Holding | None:
        try:
            raw = self._read(record_name(gpu), dir_fd)
            return Holding.from_json(json.loads(raw)) if raw else None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable or damaged: nobody we can name

    # --- writers: the holder that took or frees a lock ---------------------------------------

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[int, int]]:
        """The directory and the ledger, the ledger locked: every change of a record and every
        ledger line happen under this one lock, so a holding is closed once."""
        dir_fd = self._dir_fd()
        try:
            ledger = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                             0o600, dir_fd=dir_fd)
            try:
                fcntl.flock(ledger, fcntl.LOCK_EX)
                yield dir_fd, ledger
            finally:
                os.close(ledger)
        finally:
            os.close(dir_fd)

    def taken(self, gpu: str, holder: Holder) -> Holding:
        """Say that ``holder`` now holds ``gpu`` (the caller holds its lock). A record left by a
        dead holder is closed into the ledger first."""
        with self._writing() as (dir_fd, ledger):
            now = self.clock()
            stale = self._record(gpu, dir_fd)
            if stale is not None:
                self._append(ledger, stale, now, stale=True)
            holding = Holding(gpu=gpu, holder=holder, since=now)
            self._write_record(holding, dir_fd)
            return holding

    @staticmethod
    def _write_record(holding: Holding, dir_fd: int) -> None:
        """Replace the GPU's record whole (a new file renamed over it, never followed)."""
        name = record_name(holding.gpu)
        tmp = f".{name}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dir_fd)
        try:
            os.write(fd, json.dumps(holding.to_json()).encode())
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def measured(self, gpu: str, holding_id: str, use: dict[str, Any]) -> bool:
        """Keep what the holder of ``holding_id`` measured of its use of ``gpu`` in its record
        (it goes to the ledger with the holding). False if the record is no longer that
        holding's (it ended, or was closed as stale)."""
        with self._writing() as (dir_fd, _):
            holding = self._record(gpu, dir_fd)
            if holding is None or holding.id != holding_id:
                return False
            self._write_record(dataclasses.replace(holding, use=use), dir_fd)
            return True

    def released(self, gpu: str, holding_id: str) -> bool:
        """End the holding ``holding_id`` of ``gpu``: its interval goes to the ledger and its
        record away. Nothing happens if the record is another holding's (a later holder's, after
        this one's was closed as stale): False then."""
        with self._writing() as (dir_fd, ledger):
            holding = self._record(gpu, dir_fd)
            if holding is None or holding.id != holding_id:
                return False
            self._append(ledger, holding, self.clock(), stale=False)
            self._unlink(gpu, dir_fd)
            return True

    def close_stale(self, gpu_ids: list[str]) -> list[Holding]:
        """Close the records of dead holders (their lock free, their record left) into the
        ledger, ended now: what keeps a crashed holder's GPU time from running on until the
        next holder of that very GPU. The platform calls it whenever it takes GPUs."""
        if not any(self._exists(record_name(gpu)) for gpu in gpu_ids):
            return []
        closed: list[Holding] = []
        with self._writing() as (dir_fd, ledger):
            held = self.held_locks()  # read under the lock: a record is only written under it
            for gpu in gpu_ids:
                holding = self._record(gpu, dir_fd)
                if holding is None or self._lock_inode(gpu, dir_fd) in held:
                    continue
                self._append(ledger, holding, self.clock(), stale=True)
                self._unlink(gpu, dir_fd)
                closed.append(holding)
        return closed

    def _exists(self, name: str) -> bool:
        return os.path.lexists(self.lock_dir / name)

    @staticmethod
    def _lock_inode(gpu: str, dir_fd: int) -> int | None:
        try:
            return os.stat(lock_name(gpu), dir_fd=dir_fd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            return None

    @staticmethod
    def _unlink(gpu: str, dir_fd: int) -> None:
        try:
            os.unlink(record_name(gpu), dir_fd=dir_fd)
        except FileNotFoundError:
            pass

    @staticmethod
    def _append(ledger: int, holding: Holding, end: float, stale: bool) -> None:
        line = {**holding.to_json(), "start": holding.since, "end": max(end, holding.since)}
        line.pop("since")
        if stale:
            line["stale"] = True
        os.write(ledger, (json.dumps(line) + "\n").encode())

    # --- readers ------------------------------------------------------------------------------

    def held_locks(self) -> set[int]:
        """Inode numbers of lock files some process holds (``flock``), from ``/proc/locks``.

        Matched by inode alone: on overlay filesystems (containers) the kernel names the upper
        layer's device there, not the one ``stat`` gives, so the device cannot be compared."""
        try:
            text = Path("/proc/locks").read_text()
        except OSError:
            return set()
        held: set[int] = set()
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 6 or parts[1] != "FLOCK":  # "->": a waiter, not a holder
                continue
            try:
                held.add(int(parts[5].rsplit(":", 1)[1]))
            except (ValueError, IndexError):
                continue
        return held

    def pool(self, gpu_ids: list[str]) -> list[dict[str, Any]]:
        """Each GPU: free, or held by whom since when, and what its holder measured of its use
        (``use``; live figures are the pool view's, :mod:`tunehub_base.gpu_usage`)."""
        held = self.held_locks()
        rows: list[dict[str, Any]] = []
        try:
            dir_fd = self._dir_fd()
        except OSError:
            dir_fd = -1
        try:
            for gpu in gpu_ids:
                row: dict[str, Any] = {"gpu": gpu, "state": "free", "holder": None,
                                       "utilization": None}
                inode = self._lock_inode(gpu, dir_fd) if dir_fd >= 0 else None
                if inode is not None and inode in held:
                    row["state"] = "held"
                    holding = self._record(gpu, dir_fd)
                    if holding is not None:
                        row["holder"] = holding.holder.view()
                        row["since"] = holding.since
                        row["holding"] = holding.id
                        row["use"] = holding.use
                rows.append(row)
        finally:
            if dir_fd >= 0:
                os.close(dir_fd)
        return rows

    def intervals(self) -> Iterator[dict[str, Any]]:
        """The ledger's ended holdings, oldest first (damaged lines skipped)."""
        try:
            dir_fd = self._dir_fd(create=False)
        except FileNotFoundError:
            return
        try:
            try:
                fd = os.open(LEDGER, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except FileNotFoundError:
                return
            with os.fdopen(fd, "rb") as ledger:
                for raw in ledger:
                    try:
                        line = json.loads(raw)
                        float(line["start"]), float(line["end"]), str(line["person"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    yield line
        finally:
            os.close(dir_fd)

    def usage(self, gpu_ids: list[str], since: float, now: float | None = None) -> dict[str, Any]:
        """Allocated GPU-hours from ``since`` to now per person, hub group (where known), sweep
        and notebook: the ledger's intervals plus the holdings still open, counted up to now.
        Beside them (``used``, ``used_gpu_hours``), the GPU-hours *used* as their holders
        measured them (utilisation-weighted): a holding that lies partly in the period counts
        that part of its use; one that was never measured counts none."""
        now = self.clock() if now is None else now
        spans: list[dict[str, Any]] = list(self.intervals())
        for row in self.pool(gpu_ids):
            if row["holder"] is not None:
                spans.append({**row["holder"], "gpu": row["gpu"], "start": row["since"],
                              "end": now, "open": True, "use": row.get("use")})
        return usage_report(spans, since, now)


def usage_report(spans: list[dict[str, Any]], since: float, now: float) -> dict[str, Any]:
    """GPU-hours from ``since`` to ``now`` of ``spans`` (holdings: person, kind, groups, sweep
    or server, ``start``, ``end``, optional measured ``use``; one per GPU, or with ``gpus``,
    how many it held), per person, group, sweep and notebook, and what was used of them. The
    one sum of both modes: the lock directory's ledger here, the Kubernetes holdings'
    table (:mod:`tuner.pool_sources.kube_ledger`) there."""
    sums: dict[str, defaultdict[str, float]] = {
        k: defaultdict(float) for k in ("person", "group", "sweep", "notebook")}
    used: dict[str, defaultdict[str, float]] = {k: defaultdict(float) for k in sums}
    total = used_total = 0.0
    for span in spans:
        start, end = float(span["start"]), float(span["end"])
        seconds = max(0.0, min(end, now) - max(start, since))
        if seconds <= 0:
            continue
        hours = seconds / 3600 * int(span.get("gpus") or 1)
        use = span.get("use")
        use = use if isinstance(use, dict) else {}
        used_hours = _number(use.get("used_seconds")) / 3600 * (
            seconds / (end - start) if end > start else 1.0)
        total += hours
        used_total += used_hours
        for key in _usage_keys(span):
            sums[key[0]][key[1]] += hours
            used[key[0]][key[1]] += used_hours
    return {"since": since, "until": now, "gpu_hours": total, "used_gpu_hours": used_total,
            **{k: dict(sorted(v.items())) for k, v in sums.items()},
            "used": {k: dict(sorted(v.items())) for k, v in used.items()}}


def _usage_keys(span: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The sums a holding counts in: its person, their groups, its sweep or notebook."""
    person = str(span["person"])
    yield "person", person
    for group in span.get("groups") or ():
        yield "group", str(group)
    if span.get("kind") == "trial":
        yield "sweep", str(span.get("sweep_id"))
    else:
        server = span.get("server") or ""
        yield "notebook", f"{person}/{server}" if server else person


def _number(value: Any) -> float:
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return 0.0

"""Whether a sweep's controller is alive: how often a controller says so, how long its silence
may last before it counts as dead, and the check of its process.

A controller writes a heartbeat every :data:`HEARTBEAT_SECONDS`; one whose last heartbeat is
older than :data:`HEARTBEAT_STALE` (a few missed beats) is dead. On the controller's own machine
its process decides instead, judged by its identity (pid, start time and boot,
:mod:`tunehub_base.process_identity`), never by the pid alone: pids are reused, and a stranger
holding a dead controller's pid must not keep its sweep from resuming. Where the identity
cannot be judged (a claim written before the start time was recorded) the heartbeat decides.
The controller beats (:mod:`tuner.scheduling.controller`), the ledger claims and cancels by it
(:mod:`tuner.lifecycle.ledger`), the tuner service adopts the sweeps it finds dead
(:mod:`tuner.service`).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from tunehub_base.process_identity import ProcessIdentity
from tuner.db import SweepRow, utcnow

#: How often a running controller writes its heartbeat.
HEARTBEAT_SECONDS = 5.0
#: Missed heartbeats after which a controller on another machine counts as dead.
MISSED_BEATS = 6
#: How old a heartbeat may be before its controller counts as dead.
HEARTBEAT_STALE = timedelta(seconds=HEARTBEAT_SECONDS * MISSED_BEATS)


def this_process() -> str | None:
    """What a claim stores beside ``controller_pid`` (``controller_start``)."""
    return ProcessIdentity.current().token


def controller_identity(sweep: SweepRow) -> ProcessIdentity | None:
    """The process that claimed the sweep, as its claim recorded it."""
    if sweep.controller_pid is None:
        return None
    return ProcessIdentity.from_token(sweep.controller_pid, sweep.controller_start)


def controller_alive(sweep: SweepRow) -> bool:
    """Is the controller that claimed this sweep still running?"""
    claimed = controller_identity(sweep)
    if claimed is None or sweep.heartbeat_at is None:
        return False
    if sweep.controller_host == socket.gethostname():
        verdict = claimed.alive()
        if verdict is not None:
            return verdict
    return utcnow() - sweep.heartbeat_at < HEARTBEAT_STALE


def is_mine(sweep: SweepRow) -> bool:
    """This process is the sweep's claimed controller (an earlier process that had this pid
    is not)."""
    if sweep.controller_pid != os.getpid() or sweep.controller_host != socket.gethostname():
        return False
    start = sweep.controller_start  # none in a claim of an earlier version: the pid decides
    return start is None or ProcessIdentity.from_token(os.getpid(), start).alive() is not False

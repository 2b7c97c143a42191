"""Whether a sweep's controller is alive: how often a controller says so, how long its silence
may last before it counts as dead, and the check of its process.

A controller writes a heartbeat every :data:`HEARTBEAT_SECONDS`; one whose last heartbeat is
older than :data:`HEARTBEAT_STALE` (a few missed beats) is dead, and so is one whose process on
this machine is gone or runs something else. The controller beats (:mod:`tuner.scheduling.
controller`), the ledger claims and cancels by it (:mod:`tuner.lifecycle.ledger`), the tuner
service adopts the sweeps it finds dead (:mod:`tuner.service`).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

from tuner.db import SweepRow, utcnow

#: How often a running controller writes its heartbeat.
HEARTBEAT_SECONDS = 5.0
#: Missed heartbeats after which a controller on another machine counts as dead.
MISSED_BEATS = 6
#: How old a heartbeat may be before its controller counts as dead.
HEARTBEAT_STALE = timedelta(seconds=HEARTBEAT_SECONDS * MISSED_BEATS)


def controller_alive(sweep: SweepRow) -> bool:
    """Is the controller that claimed this sweep still running?"""
    if sweep.controller_pid is None or sweep.heartbeat_at is None:
        return False
    if sweep.controller_host == socket.gethostname():
        try:
            os.kill(sweep.controller_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        cmdline = Path(f"/proc/{sweep.controller_pid}/cmdline")
        try:
            return b"tunehub" in cmdline.read_bytes() or b"tuner" in cmdline.read_bytes()
        except OSError:
            return False
    return utcnow() - sweep.heartbeat_at < HEARTBEAT_STALE


def is_mine(sweep: SweepRow) -> bool:
    """This process is the sweep's claimed controller."""
    return sweep.controller_pid == os.getpid() and (
        sweep.controller_host == socket.gethostname()
    )

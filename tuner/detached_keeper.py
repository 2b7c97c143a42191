"""The tuner outlives a restarted hub under ``tunehub up``: sweeps and their running trials go on
while the hub is killed or stopped and started again, as people's notebook servers and the proxy
do (:mod:`hub.hub_restart`). On Kubernetes the tuner is a Deployment of its own and a hub restart
never touched it; on one machine it was the hub's child, and every restart of the hub stopped
every running trial (they ran again as attempt 2).

Two processes, so that the hub still manages a service it can start, poll and stop:

- the **stand-in** (``python -m tuner.keeper --outlive-hub PID_FILE UP``) is what the hub
  starts as its managed ``tuner`` service. It makes sure one detached keeper runs (it starts
  one when the pid file names none alive) and stays until that keeper ends, so the hub sees its
  service exit, and starts it again, only when the tuner really ended. A stop from the hub
  (SIGINT or SIGTERM, or the hub's death through the parent-death signal) ends the stand-in
  alone.
- the **detached keeper** (``--detached``, :class:`tuner.keeper.Keeper`) is nobody's child
  whose end it shares: its own session, no parent-death signal. It keeps the tuner service
  running as before. ``tunehub up`` stops it on Ctrl-C (SIGTERM, after the hub), and it stops
  of its own accord when the ``tunehub up`` that it was started under (``UP``: that process's
  identity, pid and start time, so a reused pid is not taken for it) has ended, so a killed
  ``tunehub up`` leaves no detached tuner behind. The hub it leaves (JupyterHub runs on when
  its parent dies) starts its tuner again at its next poll, as its own child then: a stand-in
  whose ``tunehub up`` has ended runs the keeper itself, as a hub started otherwise does.

The pid file lies in the hub's root-only state directory and holds the keeper's identity (pid
and start time): a record whose process ended, or whose pid another process took since, names
no keeper. A lock beside it keeps two stand-ins (a hub restarted twice in quick succession)
from starting two keepers.

The service keeps what the hub gave it when it started: its API token (the same on every start
of the hub: ``hub.hub_restart`` reads it from the state directory, so the token the service
holds stays valid, and OAuth logins to it, whose client secret it is, go on) and its TLS files
(signed by the same internal CA on every start).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from tunehub_base.parent_process import die_with_parent
from tunehub_base.process_identity import ProcessIdentity

DETACHED = "--detached"

log = logging.getLogger("tunehub.keeper")


def recorded_keeper(pid_file: Path) -> ProcessIdentity | None:
    """The live keeper ``pid_file`` names, or None."""
    try:
        keeper = ProcessIdentity.parse(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return keeper if keeper.alive() else None


def _record(pid_file: Path, keeper: ProcessIdentity) -> None:
    """Write the record whole (a reader never sees half of it), owner-only."""
    part = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(keeper.line() + "\n")
    os.replace(part, pid_file)


@contextlib.contextmanager
def _locked(pid_file: Path) -> Iterator[None]:
    fd = os.open(pid_file.with_name(pid_file.name + ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def wait_ended(process: ProcessIdentity, timeout: float | None = None) -> bool:
    """Block until ``process`` has ended (True), or ``timeout`` seconds pass (False). A pidfd
    wakes us at its end, whoever its parent is; opened only once the identity is checked."""
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return True
    try:
        if process.alive() is False:  # the pid another process's since the record
            return True
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def keeper_command(up: str, service_args: list[str]) -> list[str]:
    """The detached keeper's command: ``up`` is the identity of the ``tunehub up`` it runs under."""
    return [sys.executable, "-m", "tuner.keeper", DETACHED, up, *service_args]


def stand_in(pid_file: Path, keeper_argv: list[str]) -> int:
    """The hub's managed service: one detached keeper (started with ``keeper_argv`` when none
    runs) runs while this does."""
    die_with_parent(signal.SIGTERM)
    # A stop while the keeper is being started waits until it is recorded: one started and not
    # recorded would run beside the next stand-in's, both after the tuner's port.
    starting, asked = True, []

    def leave(signum: int, frame: FrameType | None) -> None:
        asked.append(signum)
        if not starting:
            raise SystemExit(0)  # the hub stops its service: the tuner goes on

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    with _locked(pid_file):
        keeper = recorded_keeper(pid_file)
        child = None
        if keeper is None:
            child = subprocess.Popen(keeper_argv, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
            keeper = ProcessIdentity.of(child.pid)
            _record(pid_file, keeper)
            log.info("started the tuner's keeper (pid %s); it outlives the hub", keeper.pid)
        else:
            log.info("the tuner's keeper (pid %s) runs on from before this hub started; its "
                     "sweeps and their trials went on", keeper.pid)
    starting = False
    if asked:
        return 0
    wait_ended(keeper)
    if child is not None:
        return child.wait()
    return 1  # it ended (killed, or stopped by someone else): the hub starts the tuner again


def runs(up: str) -> bool:
    """Whether the process recorded as ``up`` (an identity line) still runs."""
    try:
        return ProcessIdentity.parse(up).alive() is True
    except ValueError:
        return False


def watch_up(up: str) -> None:
    """Stop this process (SIGTERM, as ``tunehub up`` would) when the ``tunehub up`` it runs
    under has ended; a thread waits on it."""
    try:
        process = ProcessIdentity.parse(up)
    except ValueError:
        return

    def watch() -> None:
        wait_ended(process)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-tunehub-up", daemon=True).start()

"""Processes named by another program's bare pid file (JupyterHub's proxy pid file).

A bare pid can be reused; the process at that pid is taken to be the one the file names only
if it started before the file was written and its command line holds ``marker``.
"""

from __future__ import annotations

from pathlib import Path

from tunehub_base.process_identity import ProcessIdentity

#: Under ``tunehub up`` the tuner's keeper runs detached from the hub
#: (:mod:`tuner.detached_keeper`): the hub's config asks for it with this flag and names this
#: record in the hub's state directory, which ``tunehub up`` reads to stop it.
TUNER_OUTLIVES_HUB = "--outlive-hub"
TUNER_KEEPER_PID_FILE = "tuner-keeper.pid"

#: Seconds a process's start may seem to follow its pid file's writing (the boot time it is
#: reckoned from is whole seconds).
PID_FILE_SLACK = 2.0


def recorded_process(pid_file: Path, marker: bytes) -> ProcessIdentity | None:
    """The live process ``pid_file`` names, or None (no file, no such process, or a later
    process that took the pid since)."""
    try:
        pid = int(pid_file.read_text().strip())
        written = pid_file.stat().st_mtime
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        identity = ProcessIdentity.of(pid)
    except (OSError, ValueError):
        return None
    started = identity.started_at()
    if started is not None and started > written + PID_FILE_SLACK:
        return None
    return identity if marker in cmdline else None

"""Keeps the tuner service running on one machine, as a Deployment's container is kept running on
Kubernetes.

``python -m tuner.keeper`` is what the hub starts as its managed ``tuner`` service under
``tunehub up``. It runs ``python -m tuner.service`` as its child and starts it again at once when
the child dies of its own accord: a SIGKILL, the kernel's OOM killer, a crash. The hub notices
that a managed service exited only when it polls it (every 30 s), and the API and every trial's
reports were away all that time; with the keeper they are away for the seconds the new process
takes to start and resume its sweeps.

- A stop asked of the keeper (SIGINT or SIGTERM from the hub, or the hub's own death through the
  parent-death signal) is passed on to the service, and the keeper exits as the service did.
  Under ``tunehub up`` the keeper is detached from the hub instead, so that a restarted hub
  finds the tuner and its running trials as it left them (:mod:`tuner.detached_keeper`); then
  ``tunehub up`` is the one that stops it.
- The service dies with the keeper (``PR_SET_PDEATHSIG``): a killed keeper leaves nothing
  holding the port that the hub starts its successor on.
- A service that keeps dying within :data:`SETTLED_SECONDS` of starting is started again after a
  pause that doubles from the second time on, up to :data:`MAX_PAUSE_SECONDS`; each restart is
  said in the log (the hub's), with how the service ended.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from tunehub_base.exit_status import describe_exit
from tunehub_base.parent_process import die_with_parent, parent_runs
from tunehub_base.pid_files import TUNER_OUTLIVES_HUB
from tuner.detached_keeper import DETACHED, keeper_command, runs, stand_in, watch_up

#: A service that ran this long before it died is started again at once.
SETTLED_SECONDS = 30.0
MAX_PAUSE_SECONDS = 60.0

log = logging.getLogger("tunehub.keeper")


class Keeper:
    """The loop: start the service, wait for it, start it again unless a stop was asked."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.stop_signal: int | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        quick_deaths = 0  # in a row, each within SETTLED_SECONDS of its start
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
            if self.stop_signal is not None:  # asked while it was being started
                self.child.send_signal(self.stop_signal)
            code = self.child.wait()
            if self.stop_signal is not None or code == 0:
                return code if code >= 0 else 128 - code
            ran = time.monotonic() - started
            quick_deaths = quick_deaths + 1 if ran < SETTLED_SECONDS else 0
            pause = min(2.0 ** (quick_deaths - 2), MAX_PAUSE_SECONDS) if quick_deaths > 1 else 0
            log.error("the tuner service stopped unexpectedly after %.0f s, %s; starting it "
                      "again%s", ran, describe_exit(code),
                      f" in {pause:.0f} s" if pause else "")
            deadline = time.monotonic() + pause
            while self.stop_signal is None and time.monotonic() < deadline:
                time.sleep(0.2)  # a restart pause, cut short by a stop
            if self.stop_signal is not None:
                return 128 + self.stop_signal


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("TUNEHUB_LOG_LEVEL", "INFO"),
        format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s",
    )
    args, detached = sys.argv[1:], False
    if args[:1] == [TUNER_OUTLIVES_HUB] and len(args) >= 3:  # the hub's stand-in (tunehub up)
        if runs(args[2]):
            sys.exit(stand_in(Path(args[1]), keeper_command(args[2], args[3:])))
        # Its tunehub up has ended (killed), leaving this hub: its tuner is its child again.
        log.warning("tunehub up has ended; the tuner runs as the hub's child")
        args = args[3:]
    elif args[:1] == [DETACHED] and len(args) >= 2:  # started by the stand-in
        watch_up(args[1])
        args, detached = args[2:], True
    if not detached and parent_runs(b"jupyterhub"):
        die_with_parent(signal.SIGTERM)  # (passed on to the service: see the docstring)
    sys.exit(Keeper([sys.executable, "-m", "tuner.service", *args]).run())


if __name__ == "__main__":
    main()

"""The keeper (:mod:`tuner.keeper`) keeps a service running as real processes: a child that dies
of its own accord is started again at once, then with growing pauses if it keeps dying; a stop
asked of the keeper reaches the child, and the keeper exits as it did. (The real tuner service
under the keeper, killed under ``tunehub up``: ``tests/test_faults_tuner_killed.py``.)"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.polling import wait_for
from tunehub_base.process_identity import ProcessIdentity

# The child: says it started (a file per pid), records a stop it is asked, then waits.
CHILD = """
import os, signal, sys, time
where = sys.argv[1]
def stop(signum, frame):
    open(os.path.join(where, f"stopped-{os.getpid()}-{signum}"), "w").close()
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(os.path.join(where, f"started-{os.getpid()}"), "w").close()
if os.path.exists(os.path.join(where, "die-at-once")):
    sys.exit(1)
while True:
    time.sleep(1)  # a service's idle main loop
"""

KEEPER = "import sys; from tuner.keeper import Keeper; sys.exit(Keeper(sys.argv[1:]).run())"


def _start(tmp_path: Path, die_at_once: bool = False) -> tuple[subprocess.Popen[str], Path]:
    (tmp_path / "child.py").write_text(CHILD)
    where = tmp_path / "marks"
    where.mkdir()
    if die_at_once:
        (where / "die-at-once").touch()
    keeper = subprocess.Popen(
        [sys.executable, "-c", KEEPER, sys.executable, str(tmp_path / "child.py"), str(where)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return keeper, where


def _children(where: Path) -> list[int]:
    return sorted((int(p.name.split("-")[1]) for p in where.glob("started-*")),
                  key=lambda pid: (where / f"started-{pid}").stat().st_mtime_ns)


def test_a_killed_service_is_started_again_and_a_stop_reaches_it(tmp_path: Path) -> None:
    keeper, where = _start(tmp_path)
    try:
        [first] = wait_for(lambda: _children(where), what="the service to start")
        os.kill(first, signal.SIGKILL)
        pids = wait_for(lambda: _children(where) if len(_children(where)) == 2 else None,
                        what="the service to be started again")
        second = ProcessIdentity.of(pids[1])
        assert second.alive()
        keeper.send_signal(signal.SIGTERM)
        out, _ = keeper.communicate(timeout=30)
    finally:
        keeper.kill()
    # The stop reached the service, which ended as it chose; the keeper ended as it did.
    assert (where / f"stopped-{pids[1]}-{int(signal.SIGTERM)}").exists()
    assert keeper.returncode == 3, out
    assert not second.alive()
    assert re.search(r"stopped unexpectedly after \d+ s, killed by SIGKILL "
                     r"\(out of memory\?\); starting it again", out), out
    assert "starting it again\n" in out, out  # the first time: at once, no pause
    assert len(_children(where)) == 2


def test_a_service_that_keeps_dying_is_started_again_with_pauses(tmp_path: Path) -> None:
    keeper, where = _start(tmp_path, die_at_once=True)

    def fourth_ended() -> bool:
        pids = _children(where)
        if len(pids) < 4:
            return False
        try:
            return ProcessIdentity.of(pids[3]).alive() is False
        except ProcessLookupError:  # gone (or a zombie the keeper is about to reap)
            return True

    try:
        wait_for(fourth_ended, what="four quick deaths")
        keeper.send_signal(signal.SIGINT)  # in the pause before the fifth: cuts it short
        out, _ = keeper.communicate(timeout=30)
    finally:
        keeper.kill()
    lines = [line for line in out.splitlines() if "stopped unexpectedly" in line]
    assert "exited with code 1" in lines[0] and lines[0].endswith("starting it again"), out
    assert lines[1].endswith("starting it again in 1 s"), out
    assert lines[2].endswith("starting it again in 2 s"), out
    assert len(_children(where)) == 4, out
    # Stopped in the pause (128 + SIGINT), or just as the fourth was reaped (its code).
    assert keeper.returncode in (1, 128 + int(signal.SIGINT)), out


# --- detached from the hub (tuner.detached_keeper) -------------------------------------------

DETACHED_KEEPER = ("import sys; from tuner.detached_keeper import watch_up; "
                   "from tuner.keeper import Keeper; watch_up(sys.argv[1]); "
                   "sys.exit(Keeper(sys.argv[2:]).run())")
STAND_IN = ("import logging, sys; from pathlib import Path; "
            "from tuner.detached_keeper import stand_in; logging.basicConfig(level='INFO'); "
            "sys.exit(stand_in(Path(sys.argv[1]), sys.argv[2:]))")


def test_the_kept_service_outlives_the_hubs_stand_in_and_ends_with_tunehub_up(
    tmp_path: Path,
) -> None:
    """What the hub manages under ``tunehub up`` is a stand-in: it starts a keeper detached from
    it, and a stop or death of the stand-in (the hub's restart) leaves keeper and service
    running; the next stand-in finds them and starts nothing. The keeper ends, stopping its
    service, when the ``tunehub up`` it ran under has ended (here a sleeper stands for it),
    and the stand-in then ends too, so the hub would see its service gone."""
    (tmp_path / "child.py").write_text(CHILD)
    where = tmp_path / "marks"
    where.mkdir()
    pid_file = tmp_path / "tuner-keeper.pid"
    up = subprocess.Popen(["sleep", "600"])
    stand_ins: list[subprocess.Popen[str]] = []

    def stand_in() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, str(pid_file), sys.executable, "-c",
             DETACHED_KEEPER, ProcessIdentity.of(up.pid).line(), sys.executable,
             str(tmp_path / "child.py"), str(where)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stand_ins.append(proc)
        return proc

    try:
        first = stand_in()
        [service_pid] = wait_for(lambda: _children(where), what="the service to start")
        service = ProcessIdentity.of(service_pid)
        keeper = ProcessIdentity.parse(wait_for(lambda: pid_file.is_file() and
                                                pid_file.read_text(), what="the record"))
        assert keeper.alive() and keeper.pid != first.pid

        first.send_signal(signal.SIGTERM)  # the hub stops its service (its own stop)
        assert first.wait(timeout=30) == 0
        second = stand_in()
        assert second.stdout is not None
        attached = second.stdout.readline()
        assert f"the tuner's keeper (pid {keeper.pid}) runs on" in attached, attached
        assert second.poll() is None  # it stays while the keeper runs
        second.kill()  # the hub killed (SIGKILL reaches the stand-in through the death signal)
        second.wait()
        third = stand_in()
        assert third.stdout is not None
        attached = third.stdout.readline()  # (its first word, before tunehub up ends below)
        assert f"the tuner's keeper (pid {keeper.pid}) runs on" in attached, attached
        assert service.alive() and keeper.alive(), "a stand-in's end took the service along"
        assert _children(where) == [service_pid], "a second service was started"
        assert list(where.glob("stopped-*")) == []

        up.kill()  # tunehub up ends: the keeper stops its service, the stand-in sees it end
        up.wait()
        third_out, _ = third.communicate(timeout=60)
        wait_for(lambda: keeper.alive() is False, what="the keeper to end")
        assert (where / f"stopped-{service_pid}-{int(signal.SIGTERM)}").exists()
        assert third.returncode != 0, third_out  # the tuner ended: the hub starts it again
        first_out = first.communicate()[0]
        assert f"started the tuner's keeper (pid {keeper.pid})" in first_out, first_out
    finally:
        up.kill()
        for proc in stand_ins:
            proc.kill()
        # Whatever a failed run left: the keeper (nobody's child to end with) and its service,
        # each only while it is still that process (not one that took its pid since).
        records = pid_file.read_text().splitlines() if pid_file.exists() else []
        for left in [*map(ProcessIdentity.parse, records)]:
            if left.alive():
                os.kill(left.pid, signal.SIGKILL)
        for pid in _children(where):
            with contextlib.suppress(OSError):
                if str(tmp_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)

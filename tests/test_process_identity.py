"""A process is its pid, start time and boot, never its pid alone: a pid that now belongs to
another process is judged dead (a controller's claim, an attempt's pid file), a live process
alive, and a record without a start time (an earlier version's) falls back to the heartbeat.
A sweep whose controller claim names a reused pid is resumed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.conftest import Home
from tests.polling import wait_for
from tests.sweeps_helpers import parse_json, write_sweep
from tests.test_resume import GATED  # a trial blocked until its gate opens
from tunehub_base.process_identity import ProcessIdentity, boot_id, parse_records
from tuner.backends.local import cgroups
from tuner.backends.local.processes import still_running, write_pid
from tuner.cli import up
from tuner.db import Database, SweepRow, Trial, utcnow
from tuner.lifecycle.liveness import HEARTBEAT_STALE, controller_alive, is_mine

#: A live process that is not the controller, with "tuner" in its command line (what the
#: check by pid and command line took for one).
IMPOSTOR = [sys.executable, "-c", "import time; time.sleep(600)", "tuner-impostor"]


@pytest.fixture
def impostor() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(IMPOSTOR, env={**os.environ, "TUNEHUB_TRIAL_ID": "7"})
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=60)


def _reused(proc: subprocess.Popen[bytes]) -> ProcessIdentity:
    """A record of an earlier process that had ``proc``'s pid: same pid and boot, started
    before it."""
    now = ProcessIdentity.of(proc.pid)
    assert now.start is not None
    return ProcessIdentity(proc.pid, now.start - 1, now.boot)


def _claim(identity: ProcessIdentity, *, start: str | None, age: timedelta,
           host: str | None = None) -> SweepRow:
    """A sweep row as a controller's claim leaves it (never stored)."""
    return SweepRow(controller_host=host or socket.gethostname(), controller_pid=identity.pid,
                    controller_start=start, heartbeat_at=utcnow() - age)


# --- the identity itself --------------------------------------------------------------------

def test_a_live_process_is_alive_and_its_record_round_trips() -> None:
    me = ProcessIdentity.current()
    assert me.pid == os.getpid() and me.start is not None and me.boot == boot_id()
    assert me.alive() is True
    assert ProcessIdentity.parse(me.line()) == me
    assert ProcessIdentity.from_token(me.pid, me.token) == me


def test_a_pid_now_held_by_another_process_is_dead(
    impostor: subprocess.Popen[bytes],
) -> None:
    assert ProcessIdentity.of(impostor.pid).alive() is True
    assert _reused(impostor).alive() is False
    other_boot = ProcessIdentity(impostor.pid, ProcessIdentity.of(impostor.pid).start,
                                 "00000000-0000-0000-0000-000000000000")
    assert other_boot.alive() is False  # the machine rebooted since the record


def test_ended_and_zombie_processes_are_dead() -> None:
    child = subprocess.Popen(["sleep", "600"])
    record = ProcessIdentity.of(child.pid)
    assert record.alive() is True
    child.kill()
    # Not reaped yet: a zombie, dead for every purpose here.
    wait_for(lambda: record.alive() is False, timeout=60, what="the child to end")
    assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    child.wait(timeout=60)
    assert record.alive() is False  # reaped: gone, or its pid taken by someone else


def test_a_record_without_start_time_cannot_be_judged() -> None:
    assert ProcessIdentity.parse(str(os.getpid())) == ProcessIdentity(os.getpid())
    assert ProcessIdentity(os.getpid()).alive() is None
    assert ProcessIdentity.from_token(os.getpid(), None).alive() is None
    assert ProcessIdentity.from_token(os.getpid(), "garbage@x").alive() is None
    with pytest.raises(ValueError):
        ProcessIdentity.parse("1 2 3 4")


# --- the controller's claim ------------------------------------------------------------------

def test_a_reused_pid_never_counts_as_the_controller(
    impostor: subprocess.Popen[bytes],
) -> None:
    reused = _reused(impostor)
    # Even with a heartbeat of a moment ago: on its own machine, identity decides.
    assert controller_alive(_claim(reused, start=reused.token, age=timedelta(0))) is False
    live = ProcessIdentity.of(impostor.pid)
    # The claimed process itself runs: alive, however old its heartbeat (a stopped one).
    assert controller_alive(_claim(live, start=live.token, age=HEARTBEAT_STALE * 10)) is True


def test_an_old_claim_without_start_time_falls_back_to_the_heartbeat(
    impostor: subprocess.Popen[bytes],
) -> None:
    live = ProcessIdentity.of(impostor.pid)
    fresh, stale = timedelta(0), HEARTBEAT_STALE + timedelta(seconds=5)
    assert controller_alive(_claim(live, start=None, age=fresh)) is True
    # A live "tuner" process at that pid no longer keeps a silent claim alive.
    assert controller_alive(_claim(live, start=None, age=stale)) is False
    # On another machine the heartbeat decides, whatever the claim records.
    elsewhere = _reused(impostor)
    assert controller_alive(_claim(elsewhere, start=elsewhere.token, age=fresh,
                                   host="elsewhere.invalid")) is True
    assert controller_alive(_claim(live, start=live.token, age=stale,
                                   host="elsewhere.invalid")) is False


def test_this_process_is_not_mine_through_an_earlier_holder_of_its_pid() -> None:
    me = ProcessIdentity.current()
    assert me.start is not None
    assert is_mine(_claim(me, start=me.token, age=timedelta(0)))
    earlier = ProcessIdentity(me.pid, me.start - 1, me.boot)
    assert not is_mine(_claim(earlier, start=earlier.token, age=timedelta(0)))


# --- an attempt's pid file -------------------------------------------------------------------

def test_reconcile_never_kills_whoever_took_an_attempts_pid(
    impostor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The impostor even carries the attempt's trial id in its environment, the only check
    before: only its recorded start time tells it is not the attempt."""
    marker = b"TUNEHUB_TRIAL_ID=7\0"
    wait_for(lambda: marker in Path(f"/proc/{impostor.pid}/environ").read_bytes(), timeout=60,
             what="the impostor's environment")
    assert still_running(_reused(impostor), marker) is False
    assert still_running(ProcessIdentity.of(impostor.pid), marker) is True
    # An earlier version's pid file (bare pids): the marker decides, as it did.
    assert still_running(ProcessIdentity(impostor.pid), marker) is True
    assert still_running(ProcessIdentity(impostor.pid), b"TUNEHUB_TRIAL_ID=8\0") is False
    pid_file = tmp_path / "attempt-1.pid"
    write_pid(pid_file, [impostor.pid, os.getpid()])
    assert parse_records(pid_file.read_text()) == [ProcessIdentity.of(impostor.pid),
                                                   ProcessIdentity.current()]


def test_a_dead_tuners_cgroup_parent_is_cleared_though_its_pid_was_reused(
    impostor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A tuner names its cgroup parent by its pid and start; a later tuner clears the parents
    of dead ones. (Plain directories stand in for the cgroup tree: the judgement is the
    name's.)"""
    reused, me = _reused(impostor), ProcessIdentity.current()
    live = ProcessIdentity.of(impostor.pid)
    names = {"reused": f"tunehub-{reused.pid}-{reused.start}-abcd",
             "live": f"tunehub-{live.pid}-{live.start}-abcd",
             "old-live": f"tunehub-{me.pid}-abcd",  # an earlier version's name: by pid
             "mine": f"tunehub-{cgroups._owner_part()}-abcd"}
    for name in names.values():
        (tmp_path / name).mkdir()
    cgroups._clear_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        names[k] for k in ("live", "old-live", "mine"))


def test_a_leftover_proxy_is_stopped_only_if_it_is_the_one_its_pid_file_names(
    tmp_path: Path,
) -> None:
    """JupyterHub writes bare pids; a "proxy" that started after the pid file was written took
    the pid since and is left alone, the one the file names is stopped."""
    # It blocks SIGTERM, so one sent stays pending where /proc shows it at once.
    proxy = subprocess.Popen(
        [sys.executable, "-c", BLOCKS_SIGTERM, "tunehub_base.hub.proxy"], stdout=subprocess.PIPE)
    try:
        assert proxy.stdout is not None and proxy.stdout.readline() == b"blocked\n"
        started = ProcessIdentity.of(proxy.pid).started_at()
        assert started is not None and abs(started - time.time()) < 60, started
        pid_file = tmp_path / "proxy.pid"
        pid_file.write_text(str(proxy.pid))
        earlier = started - 3600
        os.utime(pid_file, (earlier, earlier))  # written an hour before this process began
        up._stop_leftover_proxy(pid_file)
        assert not _sigterm_pending(proxy.pid)
        os.utime(pid_file)  # written now, after it started: the file names it
        up._stop_leftover_proxy(pid_file)
        assert _sigterm_pending(proxy.pid)
    finally:
        proxy.kill()
        proxy.wait(timeout=60)


BLOCKS_SIGTERM = """
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("blocked", flush=True)
time.sleep(600)
"""


def _sigterm_pending(pid: int) -> bool:
    """A SIGTERM sent to the process waits, blocked (``ShdPnd`` in ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError("no ShdPnd in /proc status")


# --- a sweep whose claim names a reused pid ---------------------------------------------------

def test_a_sweep_whose_controller_pid_was_reused_is_resumed(
    sqlite_home: Home, tmp_path: Path
) -> None:
    """The controller dies and a "tuner" process now has the pid its claim names, while the
    claim's heartbeat is fresh: only the start time in the claim tells it is not the controller.

    The claim is pointed at the impostor's pid rather than the impostor started at the dead
    controller's very pid (``ns_last_pid``): on a busy machine another fork can take that pid
    first, and what the liveness rule reads (a live pid, "tuner" in its command line, another
    start time) is the same."""
    gate = tmp_path / "gate"
    spec = write_sweep(tmp_path / "code", GATED.format(gate=str(gate)), trials=2, parallelism=1,
                       max_retries=0)
    submitted = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--json", check=True).stdout)
    sweep_id = submitted["id"]
    controller = ProcessIdentity.of(submitted["controller_pid"])
    db = Database(sqlite_home.db_url)

    def claimed() -> bool:
        with db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            running = s.scalar(select(Trial.id).where(Trial.sweep_id == sweep_id,
                                                      Trial.state == "running"))
            return sweep is not None and sweep.controller_start is not None and (
                running is not None)

    wait_for(claimed, timeout=120, what="the controller's claim and a running trial")
    with db.session() as s:
        sweep = s.get(SweepRow, sweep_id)
        assert sweep is not None
        assert (sweep.controller_pid, sweep.controller_start) == (controller.pid,
                                                                 controller.token)
    os.kill(controller.pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{controller.pid}").exists(), timeout=60,
             what="the controller to die and be reaped")
    impostor = subprocess.Popen(IMPOSTOR)
    try:
        with db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            assert sweep is not None
            sweep.controller_pid = impostor.pid  # the dead controller's pid, handed out again
            sweep.heartbeat_at = utcnow()  # as if it beat just before it died
            assert not controller_alive(sweep)
        gate.touch()
        resumed = sqlite_home.cli("sweep", "resume", str(sweep_id), "--wait", "--json")
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        out = parse_json(resumed.stdout)
        assert out["state"] == "completed" and out["completed"] == 2, out
        assert impostor.poll() is None  # and nobody signalled the stranger
    finally:
        impostor.kill()
        impostor.wait(timeout=60)
        db.dispose()

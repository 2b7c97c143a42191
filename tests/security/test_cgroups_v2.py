"""#31: cgroup v2 where the machine has it, v1 otherwise, behind one base class.

These machines mount the v1 ``memory``, ``cpu`` and ``pids`` controllers and a v2 hierarchy
that offers none of them (``hugetlb`` only), so a v2 *attempt with limits* cannot run here; the
end-to-end limits are tested on v1 (``test_attempt_limits.py``). What can be tested of v2 is:

- on this machine's real cgroup2 mount (as root): a v2 group holds every process an attempt
  starts (a ``setsid`` double fork included) and ``cgroup.kill`` empties it without the tuner
  signalling any pid (so no freed and reused pid can be hit), after which it is removed;
- with stand-in trees (plain directories and a stand-in ``mountinfo``): the selection rule
  (v2 only where it offers all three controllers, else v1, else none with the reasons) and the
  files and values a v2 group's limits are written as.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hub.server_limits import LimitsUnavailable, ServerLimits
from tests.polling import wait_for
from tunehub_base.cgroups.base import Bounds
from tunehub_base.cgroups.v1 import V1Hierarchy
from tunehub_base.cgroups.v2 import V2Group, V2Hierarchy
from tuner.backends.local import cgroups

# Starts a session leader that forks a grandchild (the double fork a trial uses to escape its
# process group) and prints both pids; all of them then sleep.
ESCAPER = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""


def _real_cgroup2() -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root (these tests run as root)")
    mounts = cgroups._cgroup_mounts().get("cgroup2", [])
    if not mounts:
        pytest.skip("no cgroup2 hierarchy mounted on this machine")
    return mounts[0][1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_v2_group_on_the_real_cgroup2_mount_is_killed_whole_without_signalling_a_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    point = _real_cgroup2()
    parent = point / f"tunehub_test_{secrets.token_hex(4)}"
    parent.mkdir()
    group = V2Group([parent / "t1-a0"])
    group.directory.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", ESCAPER])
    try:
        assert (group.directory / "cgroup.kill").exists(), "Linux < 5.14: no cgroup.kill"
        group.place(proc.pid)
        # Its children are forked after the move (by the kernel: in the parent's group).
        escaped = wait_for(lambda: group.pids() if len(group.pids()) == 3 else None,
                           timeout=60, what="the double fork to start in the group")
        assert proc.pid in escaped and group.populated()
        sessions = {os.getsid(pid) for pid in escaped}
        assert len(sessions) == 2, sessions  # one left the process group and session
        signalled: list[int] = []
        monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append(pid))
        assert group.kill() is True
        monkeypatch.undo()
        assert signalled == [], "cgroup.kill must do it all: no pid is signalled"
        assert not group.populated() and not group.pids()
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert not any(_alive(pid) for pid in escaped - {proc.pid})
        group.remove()
        assert not group.directory.exists()
    finally:
        monkeypatch.undo()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for d in (group.directory, parent):
            if not d.exists():
                continue
            if (d / "cgroup.kill").exists():
                (d / "cgroup.kill").write_text("1")
            wait_for(lambda d=d: "populated 0" in (d / "cgroup.events").read_text(),
                     timeout=30, what="the test's group to empty")
            d.rmdir()


# --- the selection rule and the limits' files, on stand-in trees --------------------------

def _stand_in(tmp_path: Path, v2_controllers: str, v1: bool) -> tuple[Path, Path]:
    """A machine described by plain directories: a v2 mount offering ``v2_controllers`` and,
    with ``v1``, the three v1 hierarchies; returns (mountinfo, /proc/self/cgroup) stand-ins."""
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text(v2_controllers + "\n")
    lines = [f"30 20 0:26 / {unified} rw,nosuid - cgroup2 cgroup2 rw"]
    own = ["0::/"]
    if v1:
        for n, controller in enumerate(("memory", "cpu", "pids")):
            (tmp_path / controller).mkdir()
            lines.append(f"{31 + n} 20 0:{27 + n} / {tmp_path / controller} rw - cgroup "
                         f"cgroup rw,{controller}")
            own.append(f"{n + 2}:{controller}:/")
    mountinfo, own_cgroups = tmp_path / "mountinfo", tmp_path / "cgroup"
    mountinfo.write_text("\n".join(lines) + "\n")
    own_cgroups.write_text("\n".join(own) + "\n")
    return mountinfo, own_cgroups


BOUNDS = Bounds(memory=2 * 2**30, cpu=1.5, pids=8192)


def test_v2_is_chosen_where_it_offers_the_controllers_and_writes_v2_limits(
    tmp_path: Path,
) -> None:
    mountinfo, own = _stand_in(tmp_path, "cpuset cpu io memory hugetlb pids", v1=True)
    hierarchy, said = cgroups.open_hierarchy(mountinfo, own)
    assert isinstance(hierarchy, V2Hierarchy) and hierarchy.version == 2, said
    parent = hierarchy.parent
    assert parent.parent == tmp_path / "unified" and said == f"cgroup v2 at {parent}"
    # Controllers delegated level by level: the base, then the tuner's parent.
    for d in (tmp_path / "unified", parent):
        assert (d / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    (parent / "memory.swap.max").write_text("max")  # this machine accounts swap
    group = hierarchy.create("t7-a0", BOUNDS)
    d = parent / "t7-a0"
    assert group.dirs == [d]
    assert {f.name: f.read_text() for f in d.iterdir()} == {
        "memory.max": str(2 * 2**30), "memory.swap.max": "0",
        "cpu.max": "150000 100000", "pids.max": "8192"}
    # Without swap accounting there is no swap file to write.
    (parent / "memory.swap.max").unlink()
    hierarchy.create("t7-a1", BOUNDS)
    assert not (parent / "t7-a1" / "memory.swap.max").exists()
    # The v1 hierarchies were not touched.
    assert not [p for c in ("memory", "cpu", "pids") for p in (tmp_path / c).iterdir()]


def test_v1_is_chosen_where_v2_lacks_a_controller_as_on_these_machines(tmp_path: Path) -> None:
    mountinfo, own = _stand_in(tmp_path, "hugetlb", v1=True)
    hierarchy, said = cgroups.open_hierarchy(mountinfo, own)
    assert isinstance(hierarchy, V1Hierarchy) and hierarchy.version == 1, said
    assert said.startswith("cgroup v1 at ")
    hierarchy.create("t7-a0", BOUNDS)
    assert (tmp_path / "memory" / hierarchy.parents[0].name / "t7-a0" /
            "memory.limit_in_bytes").read_text() == str(2 * 2**30)
    assert (tmp_path / "pids" / hierarchy.parents[2].name / "t7-a0" /
            "pids.max").read_text() == "8192"
    assert not (tmp_path / "unified" / "cgroup.subtree_control").exists()


def test_neither_usable_is_none_with_every_reason(tmp_path: Path) -> None:
    mountinfo, own = _stand_in(tmp_path, "hugetlb", v1=False)
    hierarchy, said = cgroups.open_hierarchy(mountinfo, own)
    assert hierarchy is None
    assert "offers hugetlb of memory, cpu, pids" in said and "no v1 memory hierarchy" in said


# --- notebook servers' groups (hub.server_limits): the same rule, the same files ----------

def test_a_servers_group_is_v2_where_v2_offers_the_controllers(tmp_path: Path) -> None:
    mountinfo, _ = _stand_in(tmp_path, "cpuset cpu io memory hugetlb pids", v1=True)
    limits = ServerLimits.open(mountinfo)
    people = tmp_path / "unified" / "tunehub-people"
    assert limits.parents == {"unified": people}
    group = limits.make(1001, "gpu one", Bounds(memory=None, cpu=2.0, pids=300))
    d = people / "1001" / "server-gpu%20one"
    assert group.dirs == [d]
    assert {f.name: f.read_text() for f in d.iterdir()} == {
        "memory.max": "max", "cpu.max": "200000 100000", "pids.max": "300"}
    for level in (tmp_path / "unified", people, people / "1001"):  # delegated level by level
        assert (level / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert not [p for c in ("memory", "cpu", "pids") for p in (tmp_path / c).iterdir()]


def test_a_servers_group_is_v1_on_these_machines_and_says_why_there_is_none(
        tmp_path: Path) -> None:
    mountinfo, _ = _stand_in(tmp_path, "hugetlb", v1=True)
    limits = ServerLimits.open(mountinfo)
    limits.make(1001, "", Bounds(memory=2**30, cpu=None, pids=300))
    where = Path("tunehub-people/1001/server-")
    assert (tmp_path / "memory" / where / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (tmp_path / "cpu" / where / "cpu.cfs_quota_us").read_text() == "-1"
    assert (tmp_path / "pids" / where / "pids.max").read_text() == "300"
    bare = tmp_path / "bare"
    bare.mkdir()
    mountinfo, _ = _stand_in(bare, "hugetlb", v1=False)
    with pytest.raises(LimitsUnavailable) as caught:
        ServerLimits.open(mountinfo)
    assert str(caught.value) == (f"cgroup v2 at {bare / 'unified'} offers hugetlb; "
                                 "no v1 memory hierarchy mounted")

"""The whole platform as a user starts it: ``tunehub up`` (real JupyterHub, proxy, tuner
service, idle culler) on free ports with its state in a temporary ``TUNEHUB_HOME``."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests import readme
from tests.polling import wait_for
from tests.service_fixtures import free_port
from tunehub_base import unix_users
from tunehub_base.unix_users import kill_processes_of

REPO = Path(__file__).resolve().parent.parent
TUNEHUB = str(Path(sys.executable).parent / "tunehub")


@dataclass
class Platform:
    url: str
    home: Path
    data: Path
    env: dict[str, str]
    port: int
    process: subprocess.Popen[str] | None = None
    output: str = ""
    password: str | None = None

    #: What starts it: ``tunehub up`` on the test's port, or the README's words as written.
    command: list[str] | None = None

    def start(self) -> Platform:
        """Run ``tunehub up`` and wait for its announcement (the hub answers by then)."""
        self.process = subprocess.Popen(
            self.command or [TUNEHUB, "up", "--port", str(self.port)], env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
        lines: list[str] = []
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        self.output = "".join(lines)
        if self.process.poll() is not None or "tunehub is up" not in self.output:
            raise AssertionError(f"tunehub up failed:\n{self.output}\n{self.hub_log()}")
        announced = re.search(r"tunehub is up: (\S+)", self.output)
        assert announced, self.output
        self.url = announced.group(1)
        found = re.search(r"login:\s+admin / (\S+)", self.output)
        if found:
            self.password = found.group(1)
        wait_for(self._tuner_ready, timeout=120, what="the tuner service behind the hub")
        return self

    def _tuner_ready(self) -> bool:
        try:
            r = httpx.get(f"{self.url}services/tuner/api/v1/openapi.json", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def stop(self) -> int:
        """Ctrl-C, as a user would (to the whole foreground job: ``make`` and ``tunehub up``);
        returns the exit code of what was started."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()
            raise AssertionError("tunehub up did not stop within 90 s of Ctrl-C") from None
        return self.process.returncode

    def hub_log(self) -> str:
        log = self.home / "hub" / "hub.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    def tracebacks(self, most: int = 3, lines: int = 40) -> str:
        """The first ``most`` tracebacks in the hub's log (its services, the tuner among them,
        log there too), for a failing test's report: a 500 is explained by what the service
        logged, which the last lines of a long log no longer show."""
        log = self.home / "hub" / "hub.log"
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        starts = [i for i, line in enumerate(text) if "Traceback" in line][:most]
        return "\n---\n".join("\n".join(text[max(i - 2, 0):i + lines]) for i in starts)


def parent_of(pid: int) -> int:
    """The pid of ``pid``'s parent (for the tuner service under ``tunehub up``: its keeper,
    the hub's managed service)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("PPid:")[1].split()[0])


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    """A platform not yet started (``platform.start()``); stopped after the test. The digits
    example is on its data store, as a team's code would be. As root, ``tunehub up`` gives
    every account a system user: these get a prefix and group of this test's own (removed
    afterwards), and the home lies where those users can pass (not under pytest's 0700
    directory)."""
    with system_users_for_test() as (base, unix_env):
        base = base or tmp_path
        home, data = base / "tunehub", base / "data"
        shutil.copytree(REPO / "examples" / "digits", data / "digits")
        port = free_port()
        env = {
            **os.environ,
            **unix_env,
            "TUNEHUB_HOME": str(home),
            "TUNEHUB_DATA": str(data),
            "TUNEHUB_LOCAL_GPUS": "",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        env.pop("TUNEHUB_DB_URL", None)
        env.pop("TUNEHUB_API_URL", None)
        p = Platform(f"http://127.0.0.1:{port}/", home, data, env, port)
        try:
            yield p
        finally:
            p.stop()
            # Shown by pytest only when the test failed (captured output of its teardown).
            print("tracebacks in the hub's log:\n" + (p.tracebacks() or "none"))


@pytest.fixture
def readme_platform(tmp_path: Path) -> Iterator[Platform]:
    """The platform exactly as the README starts it: its quick-start command (``make up``) from
    the checkout, with no ``TUNEHUB_*`` variable set, on a fresh home: ``HOME`` is a new
    directory, so the default ``~/.tunehub`` is empty (as root, the default is that directory
    when it exists, else ``/var/lib/tunehub``, which a test must not take over: it is created
    empty first). Stopped with Ctrl-C afterwards; as root, the default Unix users and group it
    made are removed."""
    command = next(c for c in readme.quick_start_commands() if c.startswith("make up"))
    with default_system_users() as base:
        home = (base or tmp_path) / "person"
        home.mkdir(mode=0o711)
        if base:
            (home / ".tunehub").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHUB_")}
        env["HOME"] = str(home)
        p = Platform("http://127.0.0.1:8000/", home / ".tunehub", home / ".tunehub" / "data",
                     env, 8000, command=["bash", "-c", command])
        try:
            yield p
        finally:
            p.stop()


@contextlib.contextmanager
def default_system_users() -> Iterator[Path | None]:
    """As root: a passable base directory; afterwards, the system users and the group that
    ``tunehub up`` made with its default names (``tunehub-<name>``, ``tunehub``) are deleted,
    and the passage it granted that group taken back. Users and a group that existed before
    are left as they were."""
    if os.geteuid() != 0:
        yield None
        return
    prefix, group = unix_users.DEFAULT_PREFIX, unix_users.DEFAULT_GROUP
    users_before = {e.pw_name for e in pwd.getpwall()}
    group_before = group in {g.gr_name for g in grp.getgrall()}
    base = Path(tempfile.mkdtemp(prefix="tunehub-readme-"))
    os.chmod(base, 0o711)
    try:
        yield base
    finally:
        for entry in pwd.getpwall():
            if entry.pw_name.startswith(prefix) and entry.pw_name not in users_before:
                kill_processes_of(entry.pw_uid)
                subprocess.run(["userdel", entry.pw_name], check=False, capture_output=True)
        if not group_before:
            with contextlib.suppress(KeyError):
                gid = grp.getgrnam(group).gr_gid
                unix_users.revoke_passage(gid, unix_users.closed_ancestors(
                    [Path(sys.executable), Path(sys.base_prefix), REPO, base]))
                subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def system_users_for_test() -> Iterator[tuple[Path | None, dict[str, str]]]:
    """As root: a passable base directory, and a user prefix and shared group unique to this
    test, whose users and groups are deleted afterwards. The Python running the tests may live
    where other users cannot pass (pyenv under /root here): the test's group is granted passage
    (an ACL entry, execute only) on those directories for the test's duration, and only that
    entry is taken back afterwards: suites running at once keep theirs."""
    if os.geteuid() != 0:
        yield None, {}
        return
    tag = secrets.token_hex(3)
    prefix, group = f"th{tag}-", f"th{tag}"
    subprocess.run(["groupadd", "--system", group], check=True)
    base = Path(tempfile.mkdtemp(prefix="tunehub-test-"))
    os.chmod(base, 0o711)
    gid = grp.getgrnam(group).gr_gid
    granted = unix_users.grant_passage(gid, unix_users.closed_ancestors(
        [Path(sys.executable), Path(sys.base_prefix), REPO]))
    try:
        yield base, {"TUNEHUB_UNIX_USER_PREFIX": prefix, "TUNEHUB_UNIX_GROUP": group}
    finally:
        for entry in pwd.getpwall():
            if entry.pw_name.startswith(prefix):
                kill_processes_of(entry.pw_uid)
                subprocess.run(["userdel", entry.pw_name], check=False, capture_output=True)
        unix_users.revoke_passage(gid, granted)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

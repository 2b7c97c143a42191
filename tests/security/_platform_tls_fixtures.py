"""Helpers for the platform-TLS attacks: a squatter that binds a port the moment it is free and
serves TLS with the attacker's *own* notebook server certificate (the strongest thing a second
account holds: a key the internal CA signed), and processes run as a person's Unix user with
their notebook server's environment."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_for
from tunehub_base import unix_users
from tunehub_base.unix_users import UnixUser, UnixUsers

REPO = Path(__file__).resolve().parents[2]

#: Run as the attacker: bind the port as soon as it is free, then record what every client
#: sends after the handshake ("DATA:"), that it sent nothing ("NOTHING:"), or why the handshake
#: failed ("REFUSED:").
SQUATTER = r"""
import socket, ssl, sys, time
from pathlib import Path
port, (cert, key) = int(sys.argv[1]), sys.argv[2:4]
record, ready = Path(sys.argv[4]), Path(sys.argv[5])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
deadline = time.monotonic() + 120
while True:
    try:
        server.bind(("127.0.0.1", port))
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.001)  # racing the platform for the port, as an attacker would
server.listen(64)
ready.write_text("bound")
while True:
    conn, _ = server.accept()
    conn.settimeout(10)
    try:
        tls = context.wrap_socket(conn, server_side=True)
        data = tls.recv(65536)
        if data:
            line = b"DATA:" + data.replace(b"\n", b"\\n") + b"\n"
        else:  # the client finished the handshake, judged the certificate, and left
            line = b"NOTHING:\n"
    except Exception as exc:
        line = f"REFUSED:{type(exc).__name__}: {exc}\n".encode()
    with record.open("ab") as out:
        out.write(line)
    conn.close()
"""


@dataclass
class Squatter:
    """A squatter process and what it recorded."""

    process: subprocess.Popen[bytes]
    record: Path

    def lines(self) -> list[str]:
        return self.record.read_text(errors="replace").splitlines() if self.record.exists() else []

    def received(self) -> list[str]:
        """Everything any client sent it after a completed handshake."""
        return [line for line in self.lines() if line.startswith("DATA:")]


    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def as_person(user: UnixUser) -> dict[str, object]:
    """Popen arguments that run a command as ``user`` (root drops to them before exec)."""
    return {"preexec_fn": unix_users.privilege_dropper(user), "cwd": str(user.home)}


def person(env: dict[str, str], home: Path, account: str) -> UnixUser:
    """``account``'s Unix user on the platform (made by the hub when it started their server)."""
    return UnixUsers.from_env(home, env).require(account)


def server_pid(user: UnixUser) -> int:
    """The pid of ``user``'s notebook server (``jupyterhub.singleuser`` run as them)."""
    def find() -> int | None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if proc.stat().st_uid == user.uid and \
                        b"jupyterhub.singleuser" in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
        return None
    return wait_for(find, timeout=60, what=f"{user.login}'s notebook server process")


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def tuner_pids(home: Path) -> list[int]:
    """The platform's tuner service processes (``python -m tuner.service`` of this home)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"tuner.service" not in (proc / "cmdline").read_bytes():
                continue
            if environ_of(int(proc.name)).get("TUNEHUB_HOME") == str(home):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def squat(user: UnixUser, port: int, workdir: Path, cert: Path, key: Path) -> Iterator[Squatter]:
    """Run the squatter as ``user`` until the caller is done; it has bound ``port`` when this
    yields."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chown(workdir, user.uid, user.gid)
    record, ready = workdir / "record", workdir / "ready"
    process = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(port), str(cert), str(key), str(record), str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **as_person(user))  # type: ignore[call-overload]
    squatter = Squatter(process, record)
    try:
        def bound() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the squatter exited: {process.stderr.read()!r}")  # type: ignore[union-attr]
            return ready.exists()
        wait_for(bound, timeout=150, what=f"the squatter to bind port {port}")
        yield squatter
    finally:
        squatter.stop()


def run_as(user: UnixUser, env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run as ``user`` with ``env`` (their notebook server's environment)."""
    return subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120,
                          **as_person(user))  # type: ignore[call-overload]


def signed_pairs(store: Path, names: list[str]) -> tuple[str, dict[str, tuple[str, str]]]:
    """A CA (as JupyterHub's internal ones) and a certificate and key signed by it for each of
    ``names``: what a server, the proxy or a person's notebook server would hold."""
    from certipy import Certipy

    certipy = Certipy(store_dir=str(store))
    ca = certipy.create_ca("internal-ca")
    pairs = {}
    for name in names:
        record = certipy.create_signed_pair(name, "internal-ca",
                                            alt_names=["DNS:localhost", "IP:127.0.0.1"])
        pairs[name] = (record["files"]["cert"], record["files"]["key"])
    return ca["files"]["cert"], pairs

"""Each person's notebook processes are a network island of their own (#31, item 1's class run
from a notebook instead of a trial), on a real ``tunehub up`` as root with two people's Unix
users.

A cell of alice's listens (TCP on all IPv4 addresses, TCP on ``::1``, UDP on loopback, an
abstract Unix socket, and her kernel's own ZMQ ports, which JupyterLab uses); so does bob's.
Tried from bob's notebook, from a process of bob's Unix user outside any notebook, and from
alice's notebook the other way round: refused, on loopback and on the machine's own address
(the abstract socket: from the other notebook only). Alice's other kernel and the platform
(root, where the hub, the proxy and the tuner run) still get in. Alice's processes are in her
group of the fence (``tunehub-people/<uid>``), where root put her server before it ran, and in
her server's bounded groups (:mod:`hub.server_limits`): past its memory a process of hers is
killed, past its processes a thread is refused, and both groups end with her server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hub.network_fence import FenceUnavailable, NetworkFence
from hub.server_limits import ServerLimits
from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.test_hub_platform import Hub, login_token
from tests.test_unix_users import run_cell
from tunehub_base.cgroups.v1 import V1Group
from tunehub_base.unix_users import UnixUsers, privilege_dropper

pytestmark = [pytest.mark.slow]  # as root (per-person Unix users), as these machines run

# Listens in the kernel's own threads (which outlive the cell); prints its ports, its kernel's
# ports and where it lives.
LISTEN = """
import json, os, socket, threading
from ipykernel.connect import get_connection_info
def serve(sock):
    while True:
        conn, _ = sock.accept()
        conn.sendall(b"{name}'s secret")
        conn.close()
def echo(sock):
    while True:
        _, peer = sock.recvfrom(64)
        sock.sendto(b"{name}'s datagram", peer)
v4, v6 = socket.socket(socket.AF_INET), socket.socket(socket.AF_INET6)
v4.bind(("0.0.0.0", 0))
v6.bind(("::1", 0))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
unix = socket.socket(socket.AF_UNIX)
unix.bind("\\0tunehub-fence-{name}-%d" % os.getpid())
for sock in (v4, v6, unix):
    sock.listen(16)
    threading.Thread(target=serve, args=(sock,), daemon=True).start()
threading.Thread(target=echo, args=(udp,), daemon=True).start()
kernel = json.loads(get_connection_info())
print(json.dumps({{"v4": v4.getsockname()[1], "v6": v6.getsockname()[1],
                   "udp": udp.getsockname()[1], "shell": kernel["shell_port"],
                   "unix": unix.getsockname().decode(errors="replace"),
                   "cgroup": open("/proc/self/cgroup").read(), "uid": os.getuid()}}))
"""

# Tries each of another person's listeners; what it got from each.
TRY = """
import json, socket
def tcp(host, port):
    try:
        with socket.create_connection((host, port), 5) as conn:
            return conn.recv(64).decode(errors="replace") or "connected"
    except OSError as exc:
        return type(exc).__name__
def unix(name):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(name.encode())
        return sock.recv(64).decode(errors="replace") or "connected"
    except OSError as exc:
        return type(exc).__name__
def udp(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(3)
    try:
        sock.sendto(b"hello", ("127.0.0.1", port))
        return sock.recv(64).decode()
    except OSError as exc:
        return type(exc).__name__
ports, address = {ports}, {address!r}
seen = {{"v4 loopback": tcp("127.0.0.1", ports["v4"]), "v6 loopback": tcp("::1", ports["v6"]),
         "udp": udp(ports["udp"]), "kernel": tcp("127.0.0.1", ports["shell"]),
         "abstract unix": unix(ports["unix"])}}
if address:
    seen["v4 machine"] = tcp(address, ports["v4"])
print(json.dumps(seen))
"""


# Past the server's memory and processes: what happened (run as alice, bounded at 1 GiB and
# 300 processes and threads by the test's settings).
EXCEED = """
import json, subprocess, sys, threading
hog = subprocess.run([sys.executable, "-c", "b = b'x' * (3 * 2**30)"], capture_output=True)
release, started, error = threading.Event(), [], None
try:
    for _ in range(1000):
        thread = threading.Thread(target=release.wait, daemon=True)
        thread.start()
        started.append(thread)
except RuntimeError as exc:
    error = str(exc)
release.set()
for thread in started:
    thread.join()
print(json.dumps({"cgroup": open("/proc/self/cgroup").read(), "hog": hog.returncode,
                  "threads": len(started), "error": error}))
"""


def machine_address() -> str | None:
    """One of the machine's own IPv4 addresses other than loopback, if it has one."""
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    for link in json.loads(out.stdout):
        for addr in link.get("addr_info", []):
            if addr.get("scope") == "global":
                return str(addr["local"])
    return None


def tried(result: dict[str, str]) -> dict[str, str]:
    """Each answer as what it means: the secret, or how it was refused."""
    return {where: ("secret" if "secret" in got or "datagram" in got
                    else "refused" if got.endswith(("Error", "timeout")) else "connected")
            for where, got in result.items()}


def test_a_notebooks_listeners_reach_only_its_person_and_its_use_is_bounded(
        platform: Platform) -> None:
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    platform.env.update(TUNEHUB_SERVER_MEMORY="1G", TUNEHUB_SERVER_PIDS="300")
    platform.start()
    admin = Hub(platform.url, login_token(platform.url, "admin", platform.password or ""))
    admin.call("POST", "hub/api/users", 201, json={"usernames": ["alice", "bob"]})
    users = UnixUsers.from_env(platform.home, platform.env)
    tokens, ports = {}, {}
    for name in ("alice", "bob"):
        tokens[name] = admin.call("POST", f"hub/api/users/{name}/tokens", 201,
                                  json={"note": "fence"})["token"]
        admin.start_server(name, "cpu")
        ports[name] = run_cell(platform, name, tokens[name], LISTEN.format(name=name))
        uid = users.require(name).uid
        assert ports[name]["uid"] == uid
        assert f"0::/tunehub-people/{uid}/server-\n" in ports[name]["cgroup"], ports[name]
    address = machine_address()

    def attempt(who: str, target: str) -> dict[str, str]:
        return tried(run_cell(platform, who, tokens[who],
                              TRY.format(ports=ports[target], address=address)))

    everything = (["v4 loopback", "v6 loopback", "udp", "kernel", "abstract unix"]
                  + ["v4 machine"] * bool(address))
    refused = dict.fromkeys(everything, "refused")
    # Another person's notebook, either way round: nothing of theirs.
    assert attempt("bob", "alice") == refused
    assert attempt("alice", "bob") == refused
    # The person's own other kernel, and the platform (root): everything (the kernel's ZMQ
    # port answers a bare TCP connection with its greeting, not a secret: connected).
    mine = {**dict.fromkeys(everything, "secret"), "kernel": "connected"}
    assert attempt("alice", "alice") == mine
    as_root = subprocess.run([sys.executable, "-c", TRY.format(ports=ports["alice"],
                                                               address=address)],
                             capture_output=True, text=True, timeout=120, check=True)
    assert tried(json.loads(as_root.stdout)) == mine
    # Bob's Unix user outside any notebook (a process of his on the machine): refused too.
    as_bob = subprocess.run(["/usr/bin/python3", "-c", TRY.format(ports=ports["alice"],
                                                                  address=address)],
                            capture_output=True, text=True, timeout=120, check=True, cwd="/",
                            preexec_fn=privilege_dropper(users.require("bob")))
    # (Abstract Unix sockets are fenced by each server's Landlock domain, which a process
    # started outside any notebook is not in: README, "Who sees what".)
    assert tried(json.loads(as_bob.stdout)) == {**refused, "abstract unix": "secret"}

    # Alice's server is bounded (its own cgroups, by the settings): a process past its memory
    # is killed by the kernel, a thread past its processes is refused; her kernel goes on.
    limits = ServerLimits.open()
    bounded = limits.group(users.require("alice").uid, "")
    assert isinstance(bounded, V1Group)  # these machines: v1 controllers only
    assert (bounded.by_controller["memory"] / "memory.limit_in_bytes").read_text() == "1073741824\n"
    exceeded = run_cell(platform, "alice", tokens["alice"], EXCEED)
    assert exceeded["hog"] == -signal.SIGKILL, exceeded
    assert exceeded["error"] == "can't start new thread" and exceeded["threads"] < 300, exceeded
    for controller in ("memory", "cpu", "pids"):
        assert re.search(rf"^\d+:[\w,]*\b{controller}\b[\w,]*:/tunehub-people/"
                         rf"{users.require('alice').uid}/server-$", exceeded["cgroup"], re.M), \
            exceeded["cgroup"]

    # A job alice left running on its own (a new session, its parent gone: it would go on
    # using her server's GPUs) ends with her server, and so does her server's group.
    left = run_cell(platform, "alice", tokens["alice"], """
        import json, subprocess
        job = subprocess.run(["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
        print(json.dumps(int(job.stdout)))
    """)
    group = NetworkFence.open().server_group(users.require("alice").uid, "")
    assert str(left) in (group / "cgroup.procs").read_text().split()
    admin.call("DELETE", "hub/api/users/alice/server", (202, 204))
    wait_for(lambda: admin.server("alice") is None, timeout=120, what="alice's server to stop")
    wait_for(lambda: not Path(f"/proc/{left}").exists(), timeout=30,
             what="the job alice left to end with her server")
    assert not group.exists()
    assert not any(d.exists() for d in bounded.dirs)


def test_the_fence_says_why_it_cannot_be_made(tmp_path: Path) -> None:
    """Where the machine has no cgroup v2 hierarchy nftables can name, the reason names it."""
    if os.geteuid() != 0 or shutil.which("nft") is None:
        pytest.fail("the suite runs as root with nft (make test installs it)")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "31 25 0:27 /machine.slice /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "32 25 0:28 / /mnt/cgroup2 rw - cgroup2 cgroup2 rw\n")
    with pytest.raises(FenceUnavailable) as caught:
        NetworkFence.open(mountinfo)
    assert str(caught.value) == (
        "no usable cgroup v2 hierarchy: /sys/fs/cgroup/unified is a part of the hierarchy, "
        "not its root; /mnt/cgroup2 is not below /sys/fs/cgroup, where nft looks")
    mountinfo.write_text("")
    with pytest.raises(FenceUnavailable, match="none mounted"):
        NetworkFence.open(mountinfo)


"""Every attempt is its own network island (#31 item 1), on a real ``tunehub up`` as root with
two people's Unix users.

The attack that opened the issue: a ``workers: 2`` trial's TensorFlow gRPC servers listened on
the machine's loopback without authentication, and another account's process connected and ran
code as the victim. The class is "anything an attempt listens on": so a plain TCP listener in a
trial's code, and the real multi-worker TensorFlow trial's gRPC ports, are each tried from
another person's process (running as bob's uid), from alice's own other attempt, and from root
on the machine (which is where bob's notebook would be); only the attempt's own workers get in.
The attack itself is also replayed with TensorFlow (``tf.compat.v1.Session("grpc://...")`` as
bob): it runs a graph on a server it reaches, and on none of alice's (with islands off, it ran
one on both of her workers).
What the attempt reached before still works: its workers train together, it reports to the
tuner (now through its island's Unix socket), and it reaches the machine over its link
(egress). After the attempt its namespace, link and socket directory are gone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.test_hub_platform import login_token
from tunehub_base.process_identity import parse_records
from tunehub_base.unix_users import UnixUser, UnixUsers, privilege_dropper
from tuner.backends.local.island import (
    HOST_IF_PREFIX,
    ISLAND_ROOT,
    island_network,
    island_network6,
    remove_stale,
)

pytestmark = [pytest.mark.slow]  # as root (per-person Unix users), as these machines run

API = "services/tuner/api/v1/"
REPO = Path(__file__).resolve().parents[2]

# Worker 0 listens on all its addresses of one family (``FAMILY``: 4, or 6 with ``::1``; a port of
# its own choosing) and answers every connection with a secret; worker 1 connects to it at
# loopback. Worker 0 also connects out to the machine (the test's listener on its link's
# gateway), records where it lives, waits for the gate, then reports.
LISTENER = """\
import json, os, pathlib, socket, threading, time, tuner
out = pathlib.Path(os.environ["OUT"])
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
six = os.environ["FAMILY"] == "6"
name = "listener6" if six else "listener"
loopback = "::1" if six else "127.0.0.1"

def gateway():
    if six:
        routes = [line.split() for line in open("/proc/net/ipv6_route").read().splitlines()]
        return next((socket.inet_ntop(socket.AF_INET6, bytes.fromhex(r[4])) for r in routes
                     if r[0] == "0" * 32 and r[1] == "00" and r[9] == "eth0"), None)
    routes = [line.split() for line in open("/proc/net/route").read().splitlines()[1:]]
    return next((socket.inet_ntoa(bytes.fromhex(r[2])[::-1]) for r in routes
                 if r[1] == "00000000"), None)

if index == 0:
    server = socket.socket(socket.AF_INET6 if six else socket.AF_INET)
    if six:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    server.bind(("::" if six else "0.0.0.0", 0))  # loopback and its link's address
    server.listen(16)
    def serve():
        while True:
            conn, _ = server.accept()
            conn.sendall(b"alice's secret")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    egress = address = None
    try:
        with socket.create_connection((gateway(), int(os.environ["EGRESS_PORT"])), 10) as c:
            address = c.getsockname()[0]
            egress = c.recv(100).decode()
    except (OSError, TypeError) as exc:
        egress = repr(exc)
    (out / f"{name}.tmp").write_text(json.dumps({
        "port": server.getsockname()[1],
        "loopback": loopback,
        "address": address,
        "netns": os.readlink("/proc/self/ns/net"),
        "links": sorted(line.split(":")[0].strip()
                        for line in open("/proc/net/dev").read().splitlines()[2:]),
        "egress": egress,
        "socket": os.environ.get("TUNEHUB_API_SOCKET"),
    }))
    (out / f"{name}.tmp").rename(out / f"{name}.json")
    while not (out / "gate").exists():
        time.sleep(0.1)
    tuner.report(1.0)
else:
    while not (out / f"{name}.json").exists():
        time.sleep(0.1)
    port = json.loads((out / f"{name}.json").read_text())["port"]
    with socket.create_connection((loopback, port), 10) as c:
        (out / f"peer{'6' if six else ''}.txt").write_text(c.recv(100).decode())
"""

# Connects to what the listener recorded; prints what it got, as JSON.
PROBE = """\
import json, socket, sys
target = json.loads(open(sys.argv[1]).read())
got = {}
for host in (target["loopback"], target["address"]):
    if host is None:
        continue
    try:
        with socket.create_connection((host, target["port"]), 3) as c:
            got[host] = c.recv(100).decode()
    except OSError as exc:
        got[host] = type(exc).__name__
print(json.dumps(got))
"""


@dataclass
class People:
    platform: Platform
    alice: httpx.Client
    alice_user: UnixUser
    bob_user: UnixUser
    code: Path
    out: Path

    def submit(self, name: str, command: str, **extra: Any) -> int:
        spec = {"name": name, "code": str(self.code), "command": command, "metric": "score",
                "trials": 1, "parallelism": 1, "max_retries": 0, "trial_timeout": "10m",
                "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, **extra}
        r = self.alice.post("sweeps", json={"spec": spec})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def finished(self, sid: int) -> dict[str, Any] | None:
        sweep = self.alice.get(f"sweeps/{sid}").json()
        return sweep if sweep["state"] in ("completed", "failed", "cancelled") else None

    def trials(self, sid: int) -> list[dict[str, Any]]:
        return list(self.alice.get(f"sweeps/{sid}/trials").json())

    def logs(self, sid: int) -> str:
        return self.alice.get(f"sweeps/{sid}/trials/0/logs").text[-3000:]


@pytest.fixture
def people(platform: Platform) -> Iterator[People]:
    platform.start()
    assert platform.password, platform.output
    admin = httpx.Client(base_url=platform.url + "hub/api/", timeout=60, headers={
        "Authorization": f"token {login_token(platform.url, 'admin', platform.password)}"})
    r = admin.post("users", json={"usernames": ["alice", "bob"]})
    assert r.status_code == 201, r.text
    r = admin.post("users/alice/tokens", json={"note": "island test"})
    assert r.status_code == 201, r.text
    alice = httpx.Client(base_url=platform.url + API, timeout=60,
                         headers={"Authorization": f"token {r.json()['token']}"})
    code = platform.data / "users" / "alice" / "island"
    code.mkdir(parents=True)
    (code / "listener.py").write_text(LISTENER)
    shutil.copy(REPO / "examples" / "digits_multiworker" / "train.py", code / "train.py")
    out = platform.data / "island-out"
    out.mkdir()
    out.chmod(0o777)  # alice's trials write here, as alice
    (out / "probe.py").write_text(PROBE)
    users = UnixUsers.from_env(platform.home, platform.env)
    alice_user, bob_user = (users.require(name) for name in ("alice", "bob"))
    try:
        yield People(platform, alice, alice_user, bob_user, code, out)
    finally:
        (out / "gate").touch()


def probe_as(user: UnixUser | None, target: Path, env: dict[str, str]) -> dict[str, str]:
    """Run :data:`PROBE` on the machine as ``user`` (None: root), outside any island."""
    result = subprocess.run(
        [sys.executable, str(target.parent / "probe.py"), str(target)], env=env, cwd="/",
        capture_output=True, text=True, timeout=60,
        preexec_fn=privilege_dropper(user) if user is not None else None)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


CONNECT = """\
import socket, sys
where = sys.argv[1]
try:
    if where.isdigit():
        socket.create_connection(("127.0.0.1", int(where)), 3).close()
    else:
        socket.socket(socket.AF_UNIX).connect(where)
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect_as(user: UnixUser, where: int | str, env: dict[str, str]) -> str:
    """``user``'s process tries a port on the machine's loopback, or a Unix socket."""
    result = subprocess.run([sys.executable, "-c", CONNECT, str(where)], env=env, cwd="/",
                            capture_output=True, text=True, timeout=60,
                            preexec_fn=privilege_dropper(user))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def start_listener(people: People, family: int) -> tuple[int, socket.socket, Path]:
    """Alice's :data:`LISTENER` sweep over IPv``family``, once it listens: its id, the
    machine's socket it connected out to, and the file where it said where it lives."""
    egress = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET)
    egress.bind(("::" if family == 6 else "0.0.0.0", 0))
    egress.listen(4)
    egress.settimeout(1)
    name = "listener6" if family == 6 else "listener"
    sid = people.submit(name, "python listener.py", resources={"workers": 2}, env={
        "OUT": str(people.out), "EGRESS_PORT": str(egress.getsockname()[1]),
        "FAMILY": str(family)})
    target = people.out / f"{name}.json"
    wait_listening(people, sid, egress, target)
    return sid, egress, target


def wait_listening(people: People, sid: int, egress: socket.socket, target: Path) -> None:
    """Until :data:`LISTENER` has written ``target``, answering its connection out to the
    machine on ``egress`` (a listening socket with a timeout)."""

    def listening() -> bool:
        try:
            conn, _ = egress.accept()
        except OSError:
            pass
        else:
            conn.sendall(b"the machine")
            conn.close()
        if people.finished(sid):
            raise AssertionError(f"the listener ended early: {people.trials(sid)}\n"
                                 f"{people.logs(sid)}")
        return target.exists()

    wait_for(listening, timeout=300, what=f"alice's trial to write {target.name}")


def processes_in(netns: str) -> list[int]:
    """Processes of the machine in the network namespace ``netns`` (``net:[inode]``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == netns:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_what_an_attempt_listens_on_only_its_own_workers_reach(people: People) -> None:
    # Warm-started workers (forked by alice's zygote, which must join the island as alice).
    sid, egress, target = start_listener(people, 4)
    seen = json.loads(target.read_text())
    # Nobody else gets in: not bob, not root on the machine, by loopback or by its address.
    for user in (people.bob_user, None):
        got = probe_as(user, target, people.platform.env)
        assert got["127.0.0.1"] == "ConnectionRefusedError", got
        assert got.get(str(seen["address"])) != "alice's secret", got
    # Nor alice's own other attempt (cold-started: "python -u" is not forked warm).
    other = people.submit("prober", f"python -u {people.out / 'probe.py'} {target}")
    wait_for(lambda: people.finished(other), timeout=300, what="alice's other attempt")
    log = people.logs(other)
    assert "alice's secret" not in log, log
    assert "ConnectionRefusedError" in log, log
    # Its own worker does; it reached the machine over its link; it has its own socket.
    wait_for(lambda: (people.out / "peer.txt").exists(), timeout=60, what="worker 1 to connect")
    assert (people.out / "peer.txt").read_text() == "alice's secret"
    assert seen["egress"] == "the machine", seen
    assert seen["address"] and seen["socket"], seen
    assert seen["netns"] != os.readlink("/proc/self/ns/net")
    assert set(seen["links"]) == {"lo", "eth0"}, seen
    name = Path(seen["socket"]).parent.name
    assert Path(seen["socket"]).parent.parent == ISLAND_ROOT
    # Its report socket is alice's alone: bob cannot even reach it.
    assert connect_as(people.bob_user, seen["socket"], people.platform.env) == "PermissionError"
    # The gate opens: the listener reports through its island's socket and completes.
    (people.out / "gate").touch()
    finished = wait_for(lambda: people.finished(sid), timeout=120, what="the listener's sweep")
    trials = people.trials(sid)
    assert finished["state"] == "completed", (trials, people.logs(sid))
    assert trials[0]["value"] == 1.0, trials
    # The island is gone: no process in it, no link on the machine, no socket directory.
    wait_for(lambda: not processes_in(seen["netns"]), timeout=30, what="the namespace to empty")
    assert not any(n.startswith(HOST_IF_PREFIX) and name.endswith(n[len(HOST_IF_PREFIX):])
                   for n in os.listdir("/sys/class/net"))
    assert not (ISLAND_ROOT / name).exists()
    egress.close()


def test_ipv6_listeners_are_the_islands_alone_and_it_reaches_out_over_ipv6(
    people: People,
) -> None:
    """``::1`` exists in every island, and only there: what alice's attempt listens on over
    IPv6 her own worker reaches at ``::1``; bob and root on the machine reach it neither at
    ``::1`` nor at the island's address. Where the machine routes IPv6 (this one does), the
    island reaches the machine over IPv6 too."""
    sid, egress, target = start_listener(people, 6)
    try:
        seen = json.loads(target.read_text())
        for user in (people.bob_user, None):
            got = probe_as(user, target, people.platform.env)
            assert got["::1"] == "ConnectionRefusedError", got
            assert got.get(str(seen["address"])) != "alice's secret", got
        assert seen["egress"] == "the machine", seen
        assert ipaddress.IPv6Address(seen["address"]) in island_network6(
            "fd74:6e68:7562::/48"), seen
        wait_for(lambda: (people.out / "peer6.txt").exists(), timeout=60,
                 what="worker 1 to connect at ::1")
        assert (people.out / "peer6.txt").read_text() == "alice's secret"
        assert_no_spoofing_out_of(seen, people.platform.env)
        (people.out / "gate").touch()
        done = wait_for(lambda: people.finished(sid), timeout=120, what="the sweep to end")
        assert done["state"] == "completed", (people.trials(sid), people.logs(sid))
    finally:
        egress.close()


# Run as root inside an island (what its owner could do too, in the user namespace they own):
# give its link another address and send a datagram from it, then one from the island's own.
SPOOF = """\
import socket, subprocess, sys
gateway, port, own, fake = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
subprocess.run(["ip", "-6", "addr", "add", fake + "/128", "dev", "eth0", "nodad"], check=True)
for source in (fake, own):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind((source, 0))
    s.sendto(source.encode(), (gateway, port))
    s.close()
"""


def assert_no_spoofing_out_of(seen: dict[str, Any], env: dict[str, str]) -> None:
    """An island's traffic must come from an address routed back over its own link: a
    datagram to the machine from another address of the islands' range (another island's,
    say) is dropped (the nftables ``fib`` rule: IPv6 has no ``rp_filter``); one from its own
    address, sent after it, arrives."""
    own = ipaddress.IPv6Address(seen["address"])
    gateway, fake = own - 1, own + (1 << 64)  # the link's host end; the next island's range
    listener = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    listener.bind(("::", 0))
    listener.settimeout(1)
    holder = processes_in(seen["netns"])[0]
    try:
        subprocess.run(["nsenter", f"--net=/proc/{holder}/ns/net", sys.executable, "-c", SPOOF,
                        str(gateway), str(listener.getsockname()[1]), str(own), str(fake)],
                       check=True, env=env, timeout=60)
        got: list[str] = []

        def own_arrived() -> bool:
            try:
                got.append(listener.recv(100).decode())
            except OSError:
                pass
            return str(own) in got

        wait_for(own_arrived, timeout=30, what="the island's datagram from its own address")
        assert got == [str(own)], got  # the spoofed one, sent first, never came
    finally:
        listener.close()


def island_ports(home: Path, sid: int) -> tuple[int, set[int]] | None:
    """The chief's pid of sweep ``sid``'s running attempt (its pid file, chief first) and the
    TCP ports listening in its network namespace (read from its own table, as root)."""
    pid_files = sorted((home / "sweeps" / str(sid) / "trials").glob("*/attempt-*.pid"))
    if not pid_files:
        return None
    try:
        chief = parse_records(pid_files[-1].read_text())[0]
    except (OSError, ValueError, IndexError):
        return None
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{chief.pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            return None
        ports |= {int(f[1].rsplit(":", 1)[1], 16) for f in map(str.split, lines) if f[3] == "0A"}
    # Still the chief after the read (not a process that took its pid): the tables were its.
    return (chief.pid, ports) if chief.alive() is True else None


def test_multi_worker_tensorflow_trains_and_its_grpc_ports_are_closed_to_others(
    people: People,
) -> None:
    sid = people.submit("digits-mw", "python train.py", resources={"workers": 2},
                        env={"DIGITS_EPOCHS": "2"},
                        space={"lr": {"type": "categorical", "choices": [0.01]},
                               "units": {"type": "categorical", "choices": [32]}},
                        metric="val_accuracy", direction="maximize")

    def grpc_up() -> set[int] | None:
        if people.finished(sid):
            raise AssertionError(f"ended early: {people.trials(sid)}\n{people.logs(sid)}")
        found = island_ports(people.platform.home, sid)
        return found[1] if found and len(found[1]) >= 2 else None

    # Every port listening in the island (both workers' gRPC servers among them).
    ports = wait_for(grpc_up, timeout=400, what="both workers' gRPC servers to listen")
    for port in ports:
        assert connect_as(people.bob_user, port, people.platform.env) == \
            "ConnectionRefusedError"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), 3)
    done = wait_for(lambda: people.finished(sid), timeout=600, what="the training to end")
    trials = people.trials(sid)
    assert done["state"] == "completed", (trials, people.logs(sid))
    assert [r["step"] for r in trials[0]["intermediate_values"]] == [1, 2], trials
    assert "--- worker 1 ---" in people.logs(sid)


# The attack that opened the issue, replayed with TensorFlow itself: a client of a gRPC server's
# master service runs a graph there (as the server's owner). As a script it attacks each port
# given, after its own server: the control, showing the attack works wherever it connects.
GRPC_ATTACK = """\
import json, sys

import tensorflow as tf


def attack(port):
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=10000)
    try:
        with tf.Graph().as_default(), tf.compat.v1.Session(
                f"grpc://127.0.0.1:{port}", config=config) as session:
            return "ran: " + session.run(tf.constant("owned")).decode()
    except Exception as exc:
        return type(exc).__name__


if __name__ == "__main__":
    own = tf.distribute.Server({"local": ["localhost:0"]}, protocol="grpc", start=True)
    got = {"own": attack(int(own.target.rsplit(":", 1)[1]))}
    got.update({port: attack(int(port)) for port in sys.argv[1:]})
    print(json.dumps(got))
"""

# A workers: 2 trial whose workers start their real gRPC servers (the strategy's own) and hold
# them until the gate opens; worker 1 attacks worker 0's from inside the island (where the
# attack must still work: the ports are the real, unauthenticated servers).
GRPC_TRIAL = """\
import json, os, pathlib, sys, time
import tensorflow as tf
import tuner
out = pathlib.Path(os.environ["OUT"])
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # starts this worker's gRPC server
ports = [int(host.rsplit(":", 1)[1]) for host in config["cluster"]["worker"]]
if index == 0:
    (out / "cluster.tmp").write_text(json.dumps(ports))
    (out / "cluster.tmp").rename(out / "cluster.json")
else:
    sys.path.insert(0, str(out))
    from grpc_attack import attack
    (out / "inside.tmp").write_text(attack(ports[0]))
    (out / "inside.tmp").rename(out / "inside.txt")
while not (out / "gate").exists():
    time.sleep(0.1)
if index == 0:
    tuner.report(1.0)
"""


def test_the_tensorflow_grpc_attack_from_another_account_cannot_connect(
    people: People,
) -> None:
    """The issue's attack itself, ``tf.compat.v1.Session("grpc://127.0.0.1:<port>")`` from
    bob's account against a running ``workers: 2`` trial of alice's: it runs a graph on its own
    server and, from inside alice's island, on her worker's; from bob's, on neither of hers."""
    (people.out / "grpc_attack.py").write_text(GRPC_ATTACK)
    (people.code / "grpc_trial.py").write_text(GRPC_TRIAL)
    sid = people.submit("grpc", "python grpc_trial.py", resources={"workers": 2},
                        env={"OUT": str(people.out)})

    def held() -> bool:
        if people.finished(sid):
            raise AssertionError(f"ended early: {people.trials(sid)}\n{people.logs(sid)}")
        return (people.out / "cluster.json").exists() and (people.out / "inside.txt").exists()

    wait_for(held, timeout=400, what="both workers' gRPC servers, and the attack from inside")
    ports = json.loads((people.out / "cluster.json").read_text())
    assert (people.out / "inside.txt").read_text() == "ran: owned"
    result = subprocess.run(
        [sys.executable, str(people.out / "grpc_attack.py"), *map(str, ports)],
        env=people.platform.env, cwd="/", capture_output=True, text=True, timeout=300,
        preexec_fn=privilege_dropper(people.bob_user))
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.splitlines()[-1])
    assert got.pop("own") == "ran: owned", got  # the attack works where it can connect
    assert sorted(map(int, got)) == sorted(ports), got
    assert not any(what.startswith("ran") for what in got.values()), got
    # The servers were there all along: the trial still runs, and completes when let go.
    assert people.finished(sid) is None, people.trials(sid)
    (people.out / "gate").touch()
    done = wait_for(lambda: people.finished(sid), timeout=120, what="the trial to end")
    assert done["state"] == "completed", (people.trials(sid), people.logs(sid))


@pytest.mark.parametrize("text", ["10.0.0.0/33", "not-a-network", "10.0.0.1/8", "10.0.0.0/31"])
def test_a_wrong_island_network_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="^TUNEHUB_ISLAND_NETWORK: "):
        island_network(text)
    assert island_network("100.64.0.0/10").num_addresses == 1 << 22


@pytest.mark.parametrize("text", ["fd00::/72", "10.0.0.0/8", "fd00::1/48", "nope"])
def test_a_wrong_ipv6_island_network_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="^TUNEHUB_ISLAND_NETWORK6: "):
        island_network6(text)
    assert island_network6("fd74:6e68:7562::/48").num_addresses == 1 << 80


def test_socket_directories_a_dead_tuner_left_are_removed_and_live_ones_kept() -> None:
    ISLAND_ROOT.mkdir(mode=0o711, exist_ok=True)
    tag = os.urandom(4).hex()
    dead, live, young = (ISLAND_ROOT / f"test-{tag}-{kind}" for kind in ("dead", "live", "young"))
    for path in (dead, live, young):
        path.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(live / "report.sock"))
    listener.listen(1)
    (dead / "report.sock").touch()  # what a killed tuner leaves: nobody listens
    for path in (dead, live):
        os.utime(path, (0, 0))
    try:
        remove_stale()
        assert not dead.exists()
        assert live.exists() and young.exists()
    finally:
        listener.close()
        for path in (dead, live, young):
            shutil.rmtree(path, ignore_errors=True)

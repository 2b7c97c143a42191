"""Platform traffic is authenticated, not just local (#31 item 4).

On a real ``tunehub up`` as root with two people's Unix users, the second person (bob) binds the
tuner's port while the tuner is down, serving TLS with bob's *own* notebook server certificate
(signed by the platform's internal CA). Nobody's request reaches him: the proxy, alice's notebook
client and a trial's report refuse the handshake, because the certificate does not name the
tuner. The restarted tuner says who holds its port, and the platform works again once he lets
go. The pieces are also checked alone: the name check itself, and the proxy's exit naming the
holder of a taken port.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.hub_fixtures import Platform, parent_of
from tests.polling import wait_for
from tests.security._platform_tls_fixtures import (
    environ_of,
    person,
    run_as,
    server_pid,
    signed_pairs,
    squat,
    tuner_pids,
)
from tests.service_fixtures import free_port
from tests.test_hub_platform import Hub, login_token
from tunehub_base import tls

SDK_LIST = """\
from tuner.sdk.client import TunerClient
from tuner.errors import TunehubError
try:
    print("LISTED", TunerClient().request("GET", "sweeps"))
except TunehubError as exc:
    print("REFUSED", exc)
"""
TRIAL_REPORT = """\
import tuner.sdk.training as training
training.REPORT_PATIENCE_SECONDS = 0
print("ANSWER", training._post("trials/1/report", {"value": 1.0, "step": 0}))
"""


def _tuner_answers(url: str, token: str) -> bool:
    try:
        r = httpx.get(f"{url}services/tuner/api/v1/sweeps", timeout=10,
                      headers={"Authorization": f"token {token}"})
    except httpx.HTTPError:
        return False
    return r.status_code == 200


@pytest.mark.slow
def test_a_second_person_on_the_tuners_port_gets_no_token(platform: Platform) -> None:
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    hub.call("POST", "hub/api/users", 201, json={"usernames": ["alice", "bob"]})
    alice_token = hub.call("POST", "hub/api/users/alice/tokens", 201,
                           json={"note": "tls test"})["token"]
    hub.start_server("alice", "cpu")
    hub.start_server("bob", "cpu")
    alice, bob = (person(platform.env, platform.home, name) for name in ("alice", "bob"))
    alice_env = environ_of(server_pid(alice))
    tuner_url = alice_env["TUNEHUB_API_URL"]
    assert tuner_url.startswith("https://127.0.0.1:"), tuner_url
    assert alice_env[tls.ENV_API_CA] == str(platform.home / "tls" / "internal-ca.crt")
    port = int(tuner_url.split(":")[2].split("/")[0])

    # Before: alice's notebook client and the proxy reach the tuner, over TLS only.
    listed = run_as(alice, alice_env, SDK_LIST)
    assert listed.stdout.startswith("LISTED []"), listed.stdout + listed.stderr
    assert _tuner_answers(platform.url, alice_token)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/services/tuner/api/v1/sweeps", timeout=10)

    # Bob holds his own server's key and certificate, handed to him alone.
    certs = platform.home / "tls" / "servers" / bob.login
    key, cert = certs / "server.key", certs / "server.crt"
    assert key.stat().st_uid == bob.uid and key.stat().st_mode & 0o077 == 0
    assert (certs.stat().st_uid, certs.stat().st_mode & 0o777) == (0, 0o711)

    # The tuner goes down, its keeper with it (the hub's service: the hub starts it again at
    # its next poll); bob's process takes the port before that.
    victims = tuner_pids(platform.home)
    assert victims, "no tuner process found"
    for pid in [*{parent_of(pid) for pid in victims}, *victims]:
        os.kill(pid, signal.SIGKILL)
    with squat(bob, port, platform.data / "squat", cert, key) as squatter:
        r = httpx.get(f"{platform.url}services/tuner/api/v1/sweeps", timeout=60,
                      headers={"Authorization": f"token {alice_token}"})
        assert r.status_code >= 500, r.text
        listed = run_as(alice, alice_env, SDK_LIST)
        assert listed.stdout.startswith("REFUSED cannot reach the tuner"), (
            listed.stdout + listed.stderr)
        trial_env = {**alice_env, "TUNEHUB_TRIAL_TOKEN": "trial-secret"}
        report = run_as(alice, trial_env, TRIAL_REPORT)
        assert "ANSWER {}" in report.stdout, report.stdout + report.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in report.stderr or "not 'user-service'" in (
            report.stderr), report.stderr
        # Three clients connected; each judged bob's certificate and left; he read nothing.
        wait_for(lambda: len(squatter.lines()) >= 3, timeout=60,
                 what="the squatter to see the three clients")
        assert squatter.received() == [], squatter.lines()
        everything = "\n".join(squatter.lines())
        for secret in (alice_token, alice_env["JUPYTERHUB_API_TOKEN"], "trial-secret"):
            assert secret not in everything
        # The restarted tuner names who holds its port (and exits, rather than serve nothing).
        wait_for(lambda: f"held by user {bob.login}" in platform.hub_log(), timeout=120,
                 what="the restarted tuner to name the port's holder in the hub's log")

    # Bob lets go: the keeper's next start of the tuner gets its port back; everything works
    # again.
    wait_for(lambda: _tuner_answers(platform.url, alice_token), timeout=180,
             what="the tuner to answer through the proxy again")
    listed = run_as(alice, alice_env, SDK_LIST)
    assert listed.stdout.startswith("LISTED []"), listed.stdout + listed.stderr


@pytest.mark.slow
def test_the_proxy_api_is_a_socket_only_root_can_reach(platform: Platform) -> None:
    """The hub's control of routes (and the proxy's auth token it sends) travels over a Unix
    socket in the hub's root-only directory: there is no port to squat."""
    platform.start()
    state = platform.home / "hub"
    sock = state / "proxy-api.sock"
    assert sock.is_socket(), sorted(p.name for p in state.iterdir())
    assert state.stat().st_mode & 0o777 == 0o700 and state.stat().st_uid == 0
    proxy = int((state / "proxy.pid").read_text())
    listening = {line.split()[9] for table in ("/proc/net/tcp", "/proc/net/tcp6")
                 for line in Path(table).read_text().splitlines()[1:]
                 if line.split()[3] == "0A"}
    held = {os.readlink(f"/proc/{proxy}/fd/{fd}") for fd in os.listdir(f"/proc/{proxy}/fd")}
    tcp = [s for s in held if s.startswith("socket:[") and s[8:-1] in listening]
    assert len(tcp) == 1, f"the proxy listens on {len(tcp)} TCP ports, only its public one wanted"


def _send_to(cert: str, key: str, client: ssl.SSLContext) -> tuple[str, list[bytes]]:
    """Serve TLS with ``cert`` on a fresh port and send a secret there with ``client``: what
    the client saw ("sent" or its error) and what the server received."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    serving = tls.server_context(cert, key, None, require_client_cert=False)
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        try:
            with serving.wrap_socket(conn, server_side=True) as s:
                received.append(s.recv(100))
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with socket.create_connection(server.getsockname()) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(b"token secret")
        outcome = "sent"
    except ssl.SSLCertVerificationError as exc:
        outcome = str(exc)
    thread.join(timeout=30)
    server.close()
    return outcome, received


def test_a_client_accepts_only_the_name_it_expects(tmp_path: Path) -> None:
    """The internal CA signs everyone's server: the name is what tells the tuner apart."""
    ca, pairs = signed_pairs(tmp_path / "store",
                             [tls.SERVICE_IDENTITY, tls.notebook_identity("bob")])
    client = tls.pinned_client_context(ca, tls.SERVICE_IDENTITY)
    outcome, received = _send_to(*pairs[tls.SERVICE_IDENTITY], client)
    assert (outcome, received) == ("sent", [b"token secret"])
    outcome, received = _send_to(*pairs[tls.notebook_identity("bob")], client)
    assert "names 'notebook-bob', not 'user-service'" in outcome
    assert received in ([], [b""]), received


def test_people_never_get_a_certificate_named_like_the_tuner() -> None:
    names = {tls.notebook_identity(n) for n in ("service", "user-service", "hub-internal", "a")}
    assert not names & {tls.SERVICE_IDENTITY, tls.HUB_IDENTITY}
    assert len(tls.notebook_identity("x" * 32 + "@weird")) <= 64


def test_the_proxy_names_who_holds_its_port_and_exits() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hub.proxy", "--ip", "127.0.0.1", "--port", str(port),
             "--api-ip", "127.0.0.1", "--api-port", str(free_port())],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
            env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": "x"})
    finally:
        holder.close()
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert f"pid {os.getpid()}" in done.stderr, done.stderr


#: The repository's hub config, with the hub's check on servers (every 30 s by default) slowed
#: down, so the route to a server that died stays in the proxy while the test uses it, as it
#: does for up to 30 s on a real platform.
SLOW_POLL_CONFIG = """\
load_subconfig({config!r})  # noqa: F821
c.Spawner.poll_interval = 3600  # noqa: F821
"""


@pytest.mark.slow
def test_a_second_person_on_a_dead_servers_port_gets_no_request(
        platform: Platform, tmp_path: Path) -> None:
    """Alice's server dies; until the hub notices, the proxy still routes her requests to its
    port. Bob takes the port with his own (valid, CA-signed) server certificate: the proxy
    refuses him, because the route is alice's, and still reaches bob's own server."""
    config = tmp_path / "slow_poll_config.py"
    config.write_text(SLOW_POLL_CONFIG.format(config=str(Path(__file__).parents[2]
                                                          / "jupyterhub_config.py")))
    platform.command = [str(Path(sys.executable).with_name("tunehub")), "up",
                        "--port", str(platform.port), "--config", str(config)]
    platform.start()
    assert platform.password, platform.output
    hub = Hub(platform.url, login_token(platform.url, "admin", platform.password))
    hub.call("POST", "hub/api/users", 201, json={"usernames": ["alice", "bob"]})
    tokens = {name: hub.call("POST", f"hub/api/users/{name}/tokens", 201,
                             json={"note": "tls test"})["token"] for name in ("alice", "bob")}
    hub.start_server("alice", "cpu")
    hub.start_server("bob", "cpu")
    alice, bob = (person(platform.env, platform.home, name) for name in ("alice", "bob"))
    pid = server_pid(alice)
    port = int(environ_of(pid)["JUPYTERHUB_SERVICE_URL"].split(":")[2].split("/")[0])

    def status(name: str) -> int:
        return httpx.get(f"{platform.url}user/{name}/api/status", timeout=60,
                         headers={"Authorization": f"token {tokens[name]}"}).status_code

    assert status("alice") == 200
    os.kill(pid, signal.SIGKILL)
    certs = platform.home / "tls" / "servers" / bob.login
    with squat(bob, port, platform.data / "squat", certs / "server.crt",
               certs / "server.key") as squatter:
        assert status("alice") >= 500
        wait_for(squatter.lines, timeout=60, what="the proxy's connection to the squatter")
        assert squatter.received() == [], squatter.lines()
        assert tokens["alice"] not in "\n".join(squatter.lines())
        assert status("bob") == 200  # the name is checked per route: bob's own still works


def test_up_names_who_holds_a_port_it_was_told_to_use(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    env = {**os.environ, "TUNEHUB_HOME": str(tmp_path / "home"),
           "TUNEHUB_TUNER_PORT": str(port)}
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("tunehub")), "up", "--port",
                               str(free_port())], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        holder.close()
    assert done.returncode != 0
    assert f"TUNEHUB_TUNER_PORT: 127.0.0.1:{port} is already in use by user root, " \
        f"pid {os.getpid()}" in done.stderr, done.stderr


def test_the_proxy_serves_the_operators_certificate_on_the_public_port(tmp_path: Path) -> None:
    """``--ssl-key``/``--ssl-cert`` (JupyterHub's ``ssl_key``/``ssl_cert``): the public port
    speaks TLS with them; the PyPI proxy alone refuses these options."""
    ca, pairs = signed_pairs(tmp_path / "store", ["public"])
    cert, key = pairs["public"]
    port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "hub.proxy", "--ip", "127.0.0.1", "--port", str(port),
         "--api-ip", "127.0.0.1", "--api-port", str(free_port()),
         "--ssl-key", key, "--ssl-cert", cert],
        cwd=Path(__file__).parents[2], env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": "x"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def healthy() -> bool:
            assert proxy.poll() is None, proxy.stderr.read()  # type: ignore[union-attr]
            try:
                return httpx.get(f"https://127.0.0.1:{port}/_chp_healthz", verify=ssl.
                                 create_default_context(cafile=ca), timeout=5).status_code == 200
            except httpx.ConnectError:
                return False
        wait_for(healthy, timeout=60, what="the proxy to answer over TLS")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/_chp_healthz", timeout=5)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)

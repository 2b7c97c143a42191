"""``tunehub up``: the whole platform on this machine.

Starts JupyterHub with the repository's ``jupyterhub_config.py``; the hub starts the proxy
(configurable-http-proxy from PyPI), the tuner service and the idle culler as its children. The
first run creates an admin account and prints its password once (only a hash is kept); later
runs reuse ``$TUNEHUB_HOME`` (accounts, the hub's database, sweeps, models).

The hub may die (killed, a crash) while people work: it is started again, and finds their
notebook servers, the proxy and the tuner with its running trials (its keeper runs detached from
the hub, :mod:`tuner.detached_keeper`) still running (hub/hub_restart.py). Ctrl-C stops
everything: every server (through the hub's API), the hub (which stops the culler), the tuner and
the proxy.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import httpx

from tunehub_base import datastore, ports, unix_users
from tunehub_base.options import hub_state_dir, setting, url_of
from tunehub_base.pid_files import TUNER_KEEPER_PID_FILE, recorded_process
from tunehub_base.settings import load_settings
from tuner.cli import isolation
from tuner.cli.errors import EXIT_FAILED, CliError
from tuner.cli.examples import seed_examples
from tuner.detached_keeper import recorded_keeper, wait_ended

REPO_CONFIG = Path(__file__).resolve().parents[2] / "jupyterhub_config.py"
ADMIN = "admin"
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0
#: The token file the hub's config reads to let ``tunehub up`` stop every server on Ctrl-C
#: (hub/hub_restart.py; kept in sync by hand: this command imports nothing of the hub).
STOPPER_TOKEN_FILE = "up-token"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "up", help="start the hub, proxy, tuner service and idle culler on this machine"
    )
    ip, port = setting("TUNEHUB_IP"), setting("TUNEHUB_PORT")
    p.add_argument("--ip", default=ip.text(),
                   help=f"address to listen on (default {ip.value}; 0.0.0.0 for the network)")
    p.add_argument("--port", type=_port, default=_port(port.read() or str(port.value)),
                   help=f"port of the URL people open (default {port.value})")
    p.add_argument("--config", type=Path, default=REPO_CONFIG,
                   help="JupyterHub config file (default: the repository's jupyterhub_config.py)")
    p.add_argument("--reset-admin-password", action="store_true",
                   help="give the admin account a new random password and print it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the hub's log here instead of writing it to a file")
    p.set_defaults(handler=cmd_up)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def _check_port_free(ip: str, port: int, option: str = "--port") -> None:
    """Refuse to start, naming who holds it, when a port the platform must listen on is
    taken (``option``: the flag or variable that chose it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CliError(f"{option}: {ip}:{port} is already in use by "
                               f"{ports.holder(port)}; pick another port "
                               "(is tunehub already up?)") from None
            raise CliError(f"--ip: cannot listen on {ip}:{port}: {exc.strerror}") from None


def ensure_admin(accounts_file: Path, reset: bool) -> str | None:
    """Create the admin account on first run (or give it a new password); returns the
    password to print once, or ``None`` when nothing changed."""
    from tunehub_base.accounts import AccountStore, random_password

    store = AccountStore(accounts_file)
    password = random_password()
    if store.get(ADMIN) is None and not store.has_admin():
        store.create(ADMIN, password, admin=True)
        return password
    if reset:
        if store.get(ADMIN) is None:
            store.create(ADMIN, password, admin=True)
        else:
            store.set_password(ADMIN, password)
            store.set_admin(ADMIN, True)
        return password
    return None


def _code_paths() -> list[Path]:
    """Where people's processes import tunehub from: this checkout and ``PYTHONPATH``."""
    extra = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [REPO_CONFIG.parent, *extra]


def _provision_all(accounts_file: Path) -> None:
    """Every account's system user and area of the data store, before anyone logs in (the hub
    repeats this for its users; one refused login name must not keep the platform down)."""
    from tunehub_base.accounts import AccountError, AccountStore, provision_system_user

    for account in AccountStore(accounts_file).all():
        try:
            provision_system_user(account.name)
        except AccountError as exc:
            print(f"warning: {exc}", file=sys.stderr, flush=True)


def _check_hub_extra() -> None:
    """The hub runs from the hub extra's packages (its config loads traitlets, then JupyterHub);
    ``tunehub up`` starts it as a program and imports nothing of it."""
    for module in ("traitlets", "jupyterhub"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise CliError(f"tunehub up needs the hub extra (missing module {module!r}): "
                           "pip install 'tunehub[hub]'")


def cmd_up(args: argparse.Namespace) -> int:
    _check_hub_extra()

    if not args.config.is_file():
        raise CliError(f"--config: {args.config} not found (run from a tunehub checkout, or "
                       "pass the hub config file)")
    _check_port_free(args.ip, args.port)
    for variable in ("TUNEHUB_HUB_PORT", "TUNEHUB_PROXY_API_PORT", "TUNEHUB_TUNER_PORT"):
        chosen = os.environ.get(variable, "")
        if chosen.isdigit():  # chosen by the operator (else a free one is picked): taken?
            _check_port_free("127.0.0.1", int(chosen), variable)
    unix_env = dict(os.environ)
    isolated, shared_note = isolation.decide(unix_env)
    settings = load_settings(unix_env).ensure_dirs()
    env = {
        **unix_env,
        "TUNEHUB_HOME": str(settings.home),
        "TUNEHUB_MODE": "local",
        "TUNEHUB_IP": args.ip,
        "TUNEHUB_PORT": str(args.port),
    }
    internal = ("TUNEHUB_HUB_PORT", "TUNEHUB_PROXY_API_PORT", "TUNEHUB_TUNER_PORT")
    for name, port in zip(internal, ports.unclaimed_ports(len(internal)), strict=True):
        env[name] = os.environ.get(name) or str(port)
    os.environ.update(env)  # so the hub resolves its options as here
    state = hub_state_dir(settings.home, env)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    if isolated:
        try:
            isolation.prepare(settings, state, _code_paths())
        except unix_users.UnixUserError as exc:
            raise CliError(f"people's system users: {exc}") from None
    else:
        print(shared_note, flush=True)
    try:  # users/ is the platform's before anyone can log in
        datastore.prepare(settings)
    except (OSError, datastore.DataStoreError) as exc:
        raise CliError(f"the data store's users/: {exc}") from None
    seed_examples(settings)
    password = ensure_admin(state / "accounts.json", args.reset_admin_password)
    _provision_all(state / "accounts.json")

    log_path = state / "hub.log"
    jupyterhub = Path(sys.executable).with_name("jupyterhub")
    cmd = [str(jupyterhub) if jupyterhub.exists() else "jupyterhub", "-f", str(args.config)]
    log = None if args.verbose else open(log_path, "ab")
    stopper = _write_stopper_token(state / STOPPER_TOKEN_FILE)

    def start_hub() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd, cwd=state, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT if log else None,
            start_new_session=True,  # Ctrl-C reaches us; we stop the hub in order
        )

    proc = start_hub()
    stopping = _install_stop_handlers()
    public_url = url_of(args.ip, args.port)
    try:
        _wait_ready(proc, public_url, log_path if log else None, stopping)
        _announce(public_url, args.ip, password, log_path if log else None, settings.home)
        while not stopping:
            if proc.poll() is not None:
                # Killed or crashed: people's servers, the proxy and the sweeps run on; a new
                # hub finds them. One that cannot start again ends this command (_wait_ready).
                print(f"the hub stopped unexpectedly (exit {proc.returncode}); starting it "
                      "again (notebook servers and sweeps run on)", file=sys.stderr, flush=True)
                proc = start_hub()
                _wait_ready(proc, public_url, log_path if log else None, stopping)
                print("the hub is back", file=sys.stderr, flush=True)
            time.sleep(0.5)  # waiting on the hub or a stop signal, whichever comes first
        return 0
    finally:
        if proc.poll() is None:
            _stop_servers(public_url, stopper)
        _stop(proc)
        _stop_tuner(state / TUNER_KEEPER_PID_FILE)
        _stop_leftover_proxy(state / "proxy.pid")
        if log:
            log.close()


def _write_stopper_token(path: Path) -> str:
    """A new token for this run, owner-only, in the hub's root-only state directory: the hub
    lets its bearer stop servers (``hub.hub_restart``), which Ctrl-C does."""
    token = secrets.token_hex(32)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


def _stop_servers(url: str, token: str) -> None:
    """Stop every running notebook server through the hub's API (the hub leaves them running
    when it stops, so that a restarted hub finds them) and wait for them to end."""
    api = f"{url}hub/api"
    headers = {"Authorization": f"token {token}"}

    def active() -> list[tuple[str, str]]:
        r = httpx.get(f"{api}/users", params={"state": "active"}, headers=headers, timeout=10)
        r.raise_for_status()
        return [(u["name"], name) for u in r.json() for name in u.get("servers", {})]

    try:
        running = active()
        for user, name in running:
            path = f"users/{user}/servers/{name}" if name else f"users/{user}/server"
            httpx.delete(f"{api}/{path}", headers=headers, timeout=10)
        deadline = time.monotonic() + STOP_TIMEOUT
        while running and time.monotonic() < deadline:
            time.sleep(0.5)  # the hub stops them in the background
            running = active()
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        refused = isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401,
                                                                                         403)
        if not refused:  # refused: a --config without hub_restart, whose hub stops them itself
            print(f"warning: could not stop the notebook servers through the hub ({exc}); "
                  "they may still run", file=sys.stderr, flush=True)


def _install_stop_handlers() -> list[int]:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal closed) set a flag the main loop checks; the
    hub is then stopped cleanly."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
    return received


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path | None,
                stopping: list[int]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not stopping:
        if proc.poll() is not None:
            _print_tail(log_path)
            raise CliError(f"the hub failed to start (exit {proc.returncode})"
                           + (f"; see {log_path}" if log_path else ""), EXIT_FAILED)
        try:
            if httpx.get(f"{url}hub/api/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise CliError(f"the hub did not answer at {url} within {READY_TIMEOUT:.0f}s"
                           + (f"; see {log_path}" if log_path else ""), EXIT_FAILED)
        time.sleep(0.25)  # poll interval while the hub starts
    raise KeyboardInterrupt


def _announce(url: str, ip: str, password: str | None, log_path: Path | None,
              home: Path) -> None:
    lines = [f"tunehub is up: {url}"]
    if password:
        lines += [f"  login:    {ADMIN} / {password}",
                  "            (shown once; only a hash is kept. Add people on the Accounts "
                  "page.)"]
    else:
        lines += [f"  login:    {ADMIN} (password from the first run; "
                  "forgot it? tunehub up --reset-admin-password)"]
    lines += [f"  sweeps:   {url}services/tuner/", f"  state:    {home}"]
    if log_path:
        lines.append(f"  hub log:  {log_path}")
    if ip in ("0.0.0.0", "::"):
        lines.append("  note:     listening on the network over plain HTTP; put TLS in front")
    lines.append("Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the hub: it stops notebook servers, services and the proxy, then exits.
    Whatever is left of its process group after the grace period is killed."""
    if proc.poll() is None:
        try:
            print("stopping tunehub ...", flush=True)
        except OSError:  # the terminal or pipe we wrote to is gone: stop the hub regardless
            pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _stop_tuner(pid_file: Path) -> None:
    """The tuner's keeper runs detached from the hub (so that a restarted hub finds it and its
    running trials, :mod:`tuner.detached_keeper`): stopped here, after the hub, as the hub
    stopped it before. SIGTERM is passed on to the service, which stops its trials cleanly;
    SIGKILL after :data:`STOP_TIMEOUT`."""
    keeper = recorded_keeper(pid_file)
    if keeper is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(keeper.pid, sig)
        except ProcessLookupError:
            return
        if wait_ended(keeper, STOP_TIMEOUT):
            return


def _stop_leftover_proxy(pid_file: Path) -> None:
    """The hub leaves the proxy running when it stops (a restarted hub adopts it), and one
    that fails while starting exits without stopping it; the proxy (recorded in our state
    directory) would hold the port, so stop it. Only if the process at that pid started
    before the file was written: a later one took the pid since."""
    proxy = recorded_process(pid_file, b"hub.proxy")
    if proxy is not None:
        try:
            os.kill(proxy.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _print_tail(path: Path | None, lines: int = 15) -> None:
    """The end of the hub's log, before the one-line error, so the cause is on screen."""
    if path is not None and path.exists():
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        print("\n".join(tail), file=sys.stderr, flush=True)

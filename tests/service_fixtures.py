"""A real JupyterHub with the tuner as its service, for testing the tuner API end to end.

Deliberately minimal (dummy logins, no spawning): the production hub configuration is tested
in tests/test_hub_*.py; here the subject is the tuner service behind a real hub and its real
token checks.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tunehub_base.ports import unclaimed_port


def free_port() -> int:
    return unclaimed_port()


@dataclass
class TunerHub:
    url: str  # the proxy's public URL
    api: str  # the tuner API base through the proxy
    admin_token: str
    home: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: Path
    data: Path  # the data store (TUNEHUB_DATA): where the service takes code from
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, user: str, scopes: list[str]) -> str:
        """A token of ``user`` with exactly ``scopes`` (created through the hub's API)."""
        headers = {"Authorization": f"token {self.admin_token}"}
        hub = f"{self.url}hub/api"
        httpx.post(f"{hub}/users/{user}", headers=headers, timeout=30)
        r = httpx.post(
            f"{hub}/users/{user}/tokens", headers=headers, timeout=30,
            json={"scopes": scopes, "note": "test"},
        )
        r.raise_for_status()
        return str(r.json()["token"])

    def stop(self) -> None:
        """The hub stopped as a service manager stops it (SIGTERM; SIGKILL after 60 s)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """The same hub stopped and started again (its database, state directory and
        config); returns once its API answers (its tuner service starts after it)."""
        self.stop()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "jupyterhub"), "-f", "jupyterhub_config.py"],
                cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env})

        def up() -> bool:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(f"{self.url}hub/api/", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, what="the restarted hub")

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.api, headers={"Authorization": f"token {token}"}, timeout=60
        )


CONFIG = """
import sys
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.db_url = "sqlite:///{home}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{home}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{home}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{home}/proxy.pid"
c.ConfigurableHTTPProxy.command = [sys.executable, "-m", "hub.proxy"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.custom_scopes = {custom_scopes!r}
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "custom:tuner:read", "custom:tuner:submit",
                                "access:services!service=tuner"]}},
    {{"name": "test-admin", "services": ["test-admin"],
      "scopes": ["admin:users", "admin:groups", "tokens", "custom:tuner:read",
                 "custom:tuner:submit", "custom:tuner:admin", "access:services", "read:metrics"]}},
    {{"name": "tuner-admins", "users": ["boss"], "scopes": ["custom:tuner:admin"]}},
    {tuner_role!r},
]
c.JupyterHub.services = [
    {{"name": "test-admin", "api_token": "{admin_token}"}},
    {{
        "name": "tuner",
        "url": "http://127.0.0.1:{service_port}",
        "command": [sys.executable, "-m", "tuner.service"],
        "environment": {environment!r},
        "oauth_client_allowed_scopes": ["custom:tuner:read", "custom:tuner:submit"],
    }},
]
"""


@pytest.fixture
def tuner_hub(tmp_path: Path, db_url: str) -> Iterator[TunerHub]:
    with running_tuner_hub(tmp_path, db_url) as hub:
        yield hub


@contextmanager
def running_tuner_hub(
    tmp_path: Path, db_url: str, extra_env: dict[str, str] | None = None,
    extra_config: str = "",
) -> Iterator[TunerHub]:
    """The hub and its tuner service; ``extra_env`` goes to the service (e.g. the Kubernetes
    backend's settings) and the hub; ``extra_config`` is appended to the hub's config, with
    ``{port}``, ``{hub_port}``, ``{service_port}`` and ``{home}`` filled in."""
    from hub.scopes import tuner_service_role
    from tunehub_base.scopes import SCOPES

    home = tmp_path / "hub"
    home.mkdir()
    port, hub_port, service_port, proxy_api_port = (free_port() for _ in range(4))
    admin_token = secrets.token_hex(16)
    environment = {
        "TUNEHUB_HOME": str(tmp_path / "tunehub"),
        "TUNEHUB_DATA": str(tmp_path / "data"),
        "TUNEHUB_DB_URL": db_url,
        "TUNEHUB_LOCAL_GPUS": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": os.environ["PATH"],
        **(extra_env or {}),
    }
    (home / "jupyterhub_config.py").write_text(
        textwrap.dedent(
            CONFIG.format(
                port=port, hub_port=hub_port, home=home,
                custom_scopes={k: {"description": v} for k, v in SCOPES.items()},
                admin_token=admin_token, service_port=service_port,
                tuner_role=tuner_service_role("tuner"),
                proxy_api_port=proxy_api_port, environment=environment,
            )
        ) + textwrap.dedent(extra_config).format(
            port=port, hub_port=hub_port, service_port=service_port, home=home)
    )
    log = home / "jupyterhub.log"
    env = {**os.environ, **environment}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", "jupyterhub_config.py"],
            cwd=home, stdout=fh, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}/"
    hub = TunerHub(url, f"{url}services/tuner/api/v1/", admin_token, home, environment, proc, log,
                   Path(environment["TUNEHUB_DATA"]))

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"jupyterhub exited:\n{log.read_text()[-3000:]}")
        try:
            r = httpx.get(f"{url}services/tuner/api/v1/openapi.json", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    try:
        wait_for(ready, timeout=90, what="the hub and the tuner service")
        yield hub
    finally:
        hub.stop()  # the one running now (a test may have restarted it)

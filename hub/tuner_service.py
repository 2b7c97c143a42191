"""The tuner as a hub-managed service: the hub starts ``python -m tuner.service``, restarts it if
it dies, routes ``/services/tuner/`` to it through the proxy and lets people log in to its web
page with their hub account (OAuth)."""

from __future__ import annotations

import os
import sys
from typing import Any

from tunehub_base.scopes import ADMIN, READ, SUBMIT
from tunehub_base.settings import Settings
from tunehub_base.tls import ENV_API_CA

SERVICE_NAME = "tuner"


def default_command() -> list[str]:
    """The service's command on one machine: the keeper, which runs ``tuner.service`` and
    starts it again at once if it dies (:mod:`tuner.keeper`)."""
    return [sys.executable, "-m", "tuner.keeper"]

# Trial processes and the service need these from the hub's environment as they are.
_PASS_THROUGH_PREFIXES = ("TUNEHUB_", "CUDA_", "TF_")


def service_environment(
    settings: Settings, environ: dict[str, str] | None = None, api_ca: str | None = None
) -> dict[str, str]:
    """The tuner's settings, resolved once here so hub, service and trials agree on paths.
    ``api_ca``: the CA that vouches for the tuner's own certificate, which it hands its trials
    so they verify whom they report to."""
    env = environ if environ is not None else dict(os.environ)
    passed = {k: v for k, v in env.items() if k.startswith(_PASS_THROUGH_PREFIXES)}
    if api_ca:
        passed[ENV_API_CA] = api_ca
    return {
        **passed,
        "TUNEHUB_HOME": str(settings.home),
        "TUNEHUB_DB_URL": settings.db_url,
        "TUNEHUB_DATA": str(settings.data),
        "TUNEHUB_REGISTRY": str(settings.registry),
    }


def service_definition(
    url: str, environment: dict[str, str], command: list[str] | None = None
) -> dict[str, Any]:
    """``url`` is where the service listens (it serves under ``/services/tuner/``)."""
    return {
        "name": SERVICE_NAME,
        "display": True,
        "url": url,
        "command": command or default_command(),
        "environment": environment,
        "oauth_no_confirm": True,
        # The scopes a browser login to the sweeps page may carry (its OAuth token).
        "oauth_client_allowed_scopes": [READ, SUBMIT, ADMIN],
        "info": {"description": "Hyperparameter sweeps, trials and the model registry"},
    }


def sweeps_page_url(base_url: str = "/") -> str:
    return f"{base_url.rstrip('/')}/services/{SERVICE_NAME}/"

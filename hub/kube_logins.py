"""Logins of a chart install: the first admin from a Secret, or any authenticator via values.

Why: after ``helm install`` someone must be able to log in, and nobody runs ``tunehub up`` in a
cluster. Two ways, chosen by the values:

* local accounts (default): the chart passes the admin's name and the password from a Secret
  (``auth.admin``; generated once and kept by the chart, or the operator's own) as
  ``TUNEHUB_ADMIN_USER`` / ``TUNEHUB_ADMIN_PASSWORD``; :func:`ensure_secret_admin` creates that
  account on every hub start, or resets its password to the Secret's, so rotating the Secret and
  restarting the hub is how an operator recovers a lost password;
* any JupyterHub authenticator (OAuthenticator's ``generic-oauth``, ``github``, ...), configured
  the way zero-to-jupyterhub's ``hub.config`` does it: ``{ClassName: {trait: value}}`` applied to
  the hub's config by :func:`apply_hub_config`, after tunehub's own settings so the operator wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunehub_base.accounts import AccountStore

ADMIN_USER_ENV = "TUNEHUB_ADMIN_USER"
ADMIN_PASSWORD_ENV = "TUNEHUB_ADMIN_PASSWORD"


class LoginConfigError(ValueError):
    """The values' login settings are unusable; the message names the value."""


def hub_config(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``hub.config`` of the values, checked to be ``{ClassName: {trait: value}}``."""
    config = (values.get("hub") or {}).get("config") or {}
    for section, traits in config.items():
        if not isinstance(traits, Mapping):
            raise LoginConfigError(f"hub.config.{section}: expected a mapping of trait: value, "
                                   f"got {type(traits).__name__}")
    return {section: dict(traits) for section, traits in config.items()}


def uses_local_accounts(values: Mapping[str, Any]) -> bool:
    """True unless ``hub.config`` names another authenticator class."""
    return not hub_config(values).get("JupyterHub", {}).get("authenticator_class")


def apply_hub_config(c: Any, values: Mapping[str, Any]) -> None:
    """Set every ``hub.config`` trait on the hub's config ``c`` (later wins over earlier)."""
    config = hub_config(values)
    for section, traits in config.items():
        for trait, value in traits.items():
            setattr(c[section], trait, value)
    if any(traits.get("manage_groups") for traits in config.values()):
        # Groups then come from the identity provider (its ``tuner-admins`` group grants tuner
        # administration); JupyterHub refuses to start with load_groups beside it.
        c.JupyterHub.load_groups = {}


def configured_admins(values: Mapping[str, Any]) -> list[str]:
    """Admin users named in ``hub.config`` (``Authenticator.admin_users`` or the authenticator
    class's own section), so the tuner's admin role covers them too."""
    config = hub_config(values)
    names: set[str] = set()
    for traits in config.values():
        names.update(traits.get("admin_users") or [])
    return sorted(names)


def ensure_secret_admin(accounts_file: Path | str,
                        environ: Mapping[str, str] | None = None) -> str | None:
    """Create the admin account from ``TUNEHUB_ADMIN_USER``/``TUNEHUB_ADMIN_PASSWORD`` or make
    its password and admin flag match them; the admin's name, or ``None`` when not set."""
    env = os.environ if environ is None else environ
    name, password = env.get(ADMIN_USER_ENV, ""), env.get(ADMIN_PASSWORD_ENV, "")
    if not name:
        return None
    if not password:
        raise LoginConfigError(f"{ADMIN_PASSWORD_ENV}: empty for admin {name!r} (the chart sets "
                               "it from auth.admin's Secret; is its key right?)")
    store = AccountStore(accounts_file)
    account = store.get(name)
    if account is None:
        store.create(name, password, admin=True)
    else:
        if store.verify(name, password) is None:
            store.set_password(name, password)
        if not account.admin:
            store.set_admin(name, True)
    return name

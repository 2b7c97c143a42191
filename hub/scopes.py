"""Who may use the tuner: custom scopes, roles, and what a notebook's token carries.

The tuner service only *checks* scopes (``tuner.api.auth``); the hub grants them:

- every user: ``custom:tuner:read`` and ``custom:tuner:submit`` (their own sweeps and models)
  plus access to the tuner service;
- tuner admins: also ``custom:tuner:admin`` (everyone's sweeps and models): the admin accounts
  (JupyterHub does not let a config extend its built-in ``admin`` role) and members of the hub
  group ``tuner-admins``;
- ``custom:tuner:priority-high`` (submit ``priority: high`` sweeps): members of the hub group
  named by ``c.TunehubHub.high_priority_group`` (default ``tuner-priority``); tuner admins may
  anyway;
- a notebook server's ``JUPYTERHUB_API_TOKEN``: the tuner scopes of its owner, so
  ``tuner.Sweep.submit(...)`` works from a cell without asking for a token. The hub gives a token
  only the scopes its owner holds, so listing the admin scope here is safe.
"""

from __future__ import annotations

from typing import Any

from tunehub_base.scopes import ADMIN, HIGH_PRIORITY, READ, SCOPES, SUBMIT


def access_scope(service_name: str) -> str:
    return f"access:services!service={service_name}"


def user_scopes(service_name: str) -> list[str]:
    """What every user may do on the tuner (added to the hub's ``user`` role)."""
    return [READ, SUBMIT, access_scope(service_name)]


def server_token_scopes(service_name: str) -> list[str]:
    """The notebook server's own token: the hub's defaults plus the tuner."""
    return [
        "access:servers!server",
        "users:activity!user",
        READ,
        SUBMIT,
        ADMIN,
        HIGH_PRIORITY,
        access_scope(service_name),
    ]


ADMIN_GROUP = "tuner-admins"


def admin_role(admins: list[str]) -> dict[str, Any]:
    """Tuner administration for ``admins`` and the ``tuner-admins`` group."""
    return {
        "name": "tuner-admin",
        "description": "See and change every user's sweeps and models",
        "scopes": [ADMIN, "access:services!service=tuner"],
        "users": sorted(admins),
        "groups": [ADMIN_GROUP],
    }


def high_priority_role(group: str) -> dict[str, Any]:
    """``priority: high`` sweeps for the members of ``group``."""
    return {
        "name": "tuner-priority-high",
        "description": f"Submit priority: high sweeps (members of the group {group})",
        "scopes": [HIGH_PRIORITY],
        "groups": [group],
    }


def tuner_service_role(service_name: str) -> dict[str, Any]:
    """The tuner service's own token: it reads the members of hub groups, so a team's GPU
    quota counts the team's trials (one machine) and a pod's GPU-hours count for its person's
    groups (Kubernetes) (:mod:`tuner.scheduling.hub_groups`), and the GPU reports notebook
    servers send the hub, so a notebook pod's GPU-hours *used* are counted (Kubernetes,
    :mod:`tuner.pool_sources.kube_notebook_use`). Nothing else: people's identities reach it
    with their own tokens."""
    return {
        "name": "tuner-service",
        "description": "Read hub groups' members (the GPU pool's group quotas) and notebook "
                       "servers' GPU reports (GPU-hours used)",
        "scopes": ["read:groups", "read:users:activity"],
        "services": [service_name],
    }


def configure(
    c: Any, service_name: str, admins: list[str], high_priority_group: str = "tuner-priority"
) -> None:
    c.JupyterHub.custom_scopes = {
        name: {"description": text} for name, text in SCOPES.items()
    }
    c.JupyterHub.extra_user_scopes = user_scopes(service_name)
    groups: dict[str, dict[str, Any]] = {ADMIN_GROUP: {}, high_priority_group: {}}
    c.JupyterHub.load_groups = {**groups, **c.JupyterHub.get("load_groups", {})}
    c.JupyterHub.load_roles = [
        *c.JupyterHub.get("load_roles", []),
        admin_role(admins),
        high_priority_role(high_priority_group),
    ]
    c.Spawner.server_token_scopes = server_token_scopes(service_name)

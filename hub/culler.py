"""Giving idle GPUs back: jupyterhub-idle-culler with a shorter timeout for GPU servers.

The stock culler has one timeout. This one is the same program (run as a hub service, ``python -m
hub.culler``) with a cull arbiter that looks at the server's profile (``user_options["profile"]``,
set by both our local spawner and KubeSpawner): servers of a GPU profile are culled after
``gpu_timeout`` seconds idle, all others after ``timeout``.

"Idle" is the hub's ``last_activity``, which a notebook server reports while someone uses it and,
with :mod:`hub.singleuser.busy_activity`, while one of its kernels is busy running a cell. A GPU
server whose GPUs are measured unused is given back sooner, by use rather than by activity:
:mod:`hub.gpu_reclaim` (same busy rule: never mid-cell).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from jupyterhub_idle_culler import IdleCuller
from traitlets import Int, List, Unicode, default

from tunehub_base.parent_process import die_with_parent

SERVICE_NAME = "idle-culler"
# What the culler needs from the hub's API (stopping servers, reading their activity/options).
CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]


def is_gpu_server(
    server: dict[str, Any], gpu_profiles: Iterable[str], default_profile: str
) -> bool:
    options = server.get("user_options") or {}
    return (options.get("profile") or default_profile) in set(gpu_profiles)


def make_arbiter(
    gpu_timeout: int, gpu_profiles: list[str], default_profile: str
) -> Callable[..., bool]:
    """A ``cull_arbiter_hook``: GPU servers go after ``gpu_timeout``, the rest after the
    culler's own timeout (``inactive_limit``)."""

    def arbiter(*, inactive: timedelta, inactive_limit: int, server: dict[str, Any],
                **_: Any) -> bool:
        if is_gpu_server(server, gpu_profiles, default_profile):
            return inactive.total_seconds() >= gpu_timeout
        return inactive.total_seconds() >= inactive_limit

    return arbiter


class GpuAwareCuller(IdleCuller):
    """``jupyterhub-idle-culler`` whose ``--timeout`` applies to CPU-only servers."""

    gpu_timeout = Int(
        1800, help="Idle seconds after which a server of a GPU profile is stopped."
    ).tag(config=True)

    gpu_profiles = List(
        Unicode(),
        help="Profile slugs whose servers hold GPUs (user_options['profile']).",
    ).tag(config=True)

    default_profile = Unicode(
        "", help="The profile of servers started without choosing one."
    ).tag(config=True)

    aliases = {
        **IdleCuller.aliases,
        "gpu-timeout": "GpuAwareCuller.gpu_timeout",
        "default-profile": "GpuAwareCuller.default_profile",
    }

    @default("cull_every")
    def _default_cull_every(self) -> int:
        return max(1, min(self.timeout, self.gpu_timeout) // 2)

    @default("cull_arbiter_hook")
    def _default_arbiter(self) -> Callable[..., bool]:
        return make_arbiter(self.gpu_timeout, list(self.gpu_profiles), self.default_profile)


def service_definition(
    api_url: str,
    cpu_timeout: int,
    gpu_timeout: int,
    gpu_profiles: list[str],
    default_profile: str,
    cull_every: int = 0,
    internal_certs: str | None = None,
) -> dict[str, Any]:
    """The culler as a hub-managed service (see :func:`culler_role` for its permissions).
    ``internal_certs``: the hub's internal TLS store, whose hub certificate the culler calls
    the hub's API with (it runs as the hub's user)."""
    command = [
        sys.executable, "-m", "hub.culler",
        f"--url={api_url}",
        f"--timeout={cpu_timeout}",
        f"--gpu-timeout={gpu_timeout}",
        f"--default-profile={default_profile}",
        f"--GpuAwareCuller.gpu_profiles={gpu_profiles!r}",
    ]
    if cull_every:
        command.append(f"--cull-every={cull_every}")
    if internal_certs:
        command += ["--ssl-enabled=true", f"--internal-certs-location={internal_certs}"]
    return {"name": SERVICE_NAME, "command": command}


def culler_role() -> dict[str, Any]:
    return {"name": "idle-culler", "scopes": CULLER_SCOPES, "services": [SERVICE_NAME]}


def main() -> None:
    # The hub stops its services with SIGINT first, which the stock culler ignores: every hub
    # shutdown waited out the hub's interrupt timeout. The culler keeps no state; just exit.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent(signal.SIGTERM)  # a killed hub's culler must not cull beside the next one's
    GpuAwareCuller.launch_instance()


if __name__ == "__main__":
    main()

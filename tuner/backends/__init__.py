"""Execution backends: where trial attempts run.

``local`` runs processes on this machine (the embedded default); ``kubernetes`` runs Jobs on a
cluster. Each lives in its own module behind :class:`Backend`.
"""

from __future__ import annotations

from tunehub_base.settings import Settings
from tuner.backends._base import Backend, TrialEvent, TrialLaunch
from tuner.spec import SpecError

BACKENDS = ("local", "kubernetes")

__all__ = ["BACKENDS", "Backend", "TrialEvent", "TrialLaunch", "make_backend"]


def make_backend(name: str, settings: Settings) -> Backend:
    """Build the named backend from settings (environment)."""
    if name == "local":
        from tuner.backends.local import LocalBackend

        return LocalBackend(settings.gpu_locks_dir)
    if name == "kubernetes":
        from tuner.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_env()
    raise SpecError("backend", f"expected one of {' | '.join(BACKENDS)}, got {name!r}")

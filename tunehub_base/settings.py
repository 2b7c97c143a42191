"""Where tunehub keeps its state, read from the environment.

This module is the one reader of the variables that say where state lives (:data:`STATE_VARS`:
``TUNEHUB_HOME``, ``TUNEHUB_DB_URL``, ``TUNEHUB_DATA``, ``TUNEHUB_REGISTRY``,
``TUNEHUB_SERVING_ROOT``), so the CLI, the tuner service, the hub and trials agree on paths. One
exception: a trial's :func:`tuner.sdk.training.data_dir` takes ``TUNEHUB_DATA`` as the controller or
the notebook spawner set it, and falls back to this module. ``tests/test_layering.py`` keeps
this true.

Every other ``TUNEHUB_*`` variable configures one part and is read there: the hub's options
(:mod:`hub.options`), the Kubernetes backend (``TUNEHUB_K8S_*``,
:mod:`tuner.backends.kubernetes.settings`), a trial's own variables (:mod:`tuner.sdk.training`), the
service (:mod:`tuner.service`), ``tunehub up`` (:mod:`tuner.cli.up`), and so on.

Nothing here creates files; callers ask for the directories with :meth:`Settings.ensure_dirs`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str
    data: Path
    registry: Path
    #: The registry's root as TensorFlow Serving sees it (its model config's base paths).
    serving_root: str | None = None

    @property
    def sweeps_dir(self) -> Path:
        """Per-sweep state: code snapshot, trial working directories, logs, artifacts."""
        return self.home / "sweeps"

    @property
    def gpu_locks_dir(self) -> Path:
        """Lock files that keep two trials (even from two processes) off one GPU."""
        return self.home / "gpu-locks"

    @property
    def examples_dir(self) -> Path:
        """The examples the README names, seeded into the data store on first start."""
        return self.data / "examples"

    def state_paths(self) -> list[Path]:
        """Everything of tunehub's own state that is not a plain directory of the home: the
        model registry (inside the data store by default) and a SQLite database wherever its URL
        puts it. With :meth:`is_state` these are what code may never come from."""
        paths = [self.registry]
        if self.db_url.startswith("sqlite:///"):
            paths.append(Path(self.db_url.removeprefix("sqlite:///")).resolve())
        return paths

    def is_state(self, path: Path) -> bool:
        """Whether ``path`` (resolved) is tunehub's own state rather than people's data.

        The home is state (database, hub state and secrets, sweeps, notebook homes), except the
        data store when it lies strictly inside the home (the default ``$TUNEHUB_HOME/data``).
        A data store that *is* the home, or a home inside the data store, leaves the home
        state: the rule never depends on which of the two contains the other."""
        if any(inside(path, p) for p in self.state_paths()):
            return True
        data_below_home = self.data != self.home and inside(self.data, self.home)
        return inside(path, self.home) and not (data_below_home and inside(path, self.data))

    def ensure_dirs(self) -> Settings:
        for path in (self.home, self.data, self.registry, self.sweeps_dir, self.gpu_locks_dir):
            path.mkdir(parents=True, exist_ok=True)
        return self


def inside(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or lies below it (both resolved)."""
    return path == root or root in path.parents


SYSTEM_HOME = Path("/var/lib/tunehub")
#: The variables :func:`load_settings` reads: where tunehub's state lives.
STATE_VARS = (
    "TUNEHUB_HOME", "TUNEHUB_DB_URL", "TUNEHUB_DATA", "TUNEHUB_REGISTRY", "TUNEHUB_SERVING_ROOT"
)


def default_home() -> Path:
    """``~/.tunehub``; for root ``/var/lib/tunehub`` (root's home is closed to the system users
    people's notebooks and trials run as), unless a ``~/.tunehub`` of root's already exists."""
    own = Path.home() / ".tunehub"
    return SYSTEM_HOME if os.geteuid() == 0 and not own.exists() else own


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read settings: ``TUNEHUB_HOME`` (default :func:`default_home`), ``TUNEHUB_DB_URL`` (default a
    SQLite file in the home), ``TUNEHUB_DATA`` (default ``$TUNEHUB_HOME/data``) and
    ``TUNEHUB_REGISTRY`` (default ``$TUNEHUB_DATA/models``, so serving reads the data store) and
    ``TUNEHUB_SERVING_ROOT`` (where TensorFlow Serving mounts the registry; default: the same
    path)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("TUNEHUB_HOME") or default_home()).expanduser().resolve()
    db_url = env.get("TUNEHUB_DB_URL") or f"sqlite:///{home / 'tunehub.sqlite'}"
    data = Path(env.get("TUNEHUB_DATA") or home / "data").expanduser().resolve()
    registry = Path(env.get("TUNEHUB_REGISTRY") or data / "models").expanduser().resolve()
    return Settings(home=home, db_url=db_url, data=data, registry=registry,
                    serving_root=env.get("TUNEHUB_SERVING_ROOT") or None)

"""``tunehub up``'s choice between one Unix user per person and one shared Unix account.

As root (``TUNEHUB_UNIX_USERS`` unset or ``1``): every account gets a system user
(:mod:`tunehub_base.unix_users`), and the platform's files are laid out so those users can reach
their own things and the shared data store, and nothing of the platform's:

==========================  ===========================  ==========================================
path                        owner, mode                  why
==========================  ===========================  ==========================================
``$TUNEHUB_HOME``           root, 0711                   passable to reach homes and trial dirs
``hub/`` (state, secrets)   root, 0700                   cookie secret, accounts, hub database
tuner database, secrets     root, 0600                   created under umask 077
``gpu-locks/``              root, 0700                   only the platform takes and frees GPUs
                                                         and records who holds them (the ledger)
``sweeps/``                 root, 0711                   see :mod:`tuner.backends.local.ownership`
``users/<name>``            the person, 0700             their notebook home
data store                  root:tunehub, 3775           everyone reads; everyone adds files; the
                                                         sticky bit keeps others' files theirs
registry (``models/``)      root, 0700                   written by the tuner only; models are
                                                         reached through the API (own + admin)
==========================  ===========================  ==========================================

Not root: today's behaviour (everyone's servers and trials run as this user), said once.
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

from tunehub_base import unix_users
from tunehub_base.settings import Settings
from tuner.cli.errors import CliError

SHARED_NOTE = ("note: everyone's notebooks and trials share this Unix account ({user}); "
               "run tunehub up as root, or use Kubernetes, to isolate people")


def decide(environ: dict[str, str]) -> tuple[bool, str | None]:
    """Whether people get system users (and sets ``TUNEHUB_UNIX_USERS`` in ``environ`` so the
    hub and the tuner agree), and the one line to print when they do not."""
    asked = environ.get(unix_users.ENV_ENABLED, "auto").strip().lower() or "auto"
    if asked not in ("auto", "1", "0", "true", "false", "yes", "no", "on", "off"):
        raise CliError(f"{unix_users.ENV_ENABLED}={asked!r}: expected 1, 0 or auto")
    root = os.geteuid() == 0
    on = root if asked == "auto" else asked in ("1", "true", "yes", "on")
    if on and not root:
        raise CliError(f"{unix_users.ENV_ENABLED}=1: a system user per person needs "
                       "tunehub up to run as root")
    environ[unix_users.ENV_ENABLED] = "1" if on else "0"
    return on, None if on else SHARED_NOTE.format(user=pwd.getpwuid(os.getuid()).pw_name)


def prepare(settings: Settings, state_dir: Path, code_paths: list[Path]) -> None:
    """Lay out the platform's files for isolated people (see the module text), then check that
    their processes can run this Python, import tunehub and reach their homes at all."""
    users = unix_users.UnixUsers.from_env(settings.home)
    gid = users.group_id()
    os.umask(0o077)  # whatever the platform creates from here on is its own
    os.chmod(settings.home, 0o711)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    settings.gpu_locks_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.gpu_locks_dir, 0o700)
    for path in settings.home.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)  # the tuner database (SQLite) and its journal, secrets
    for passable in (settings.sweeps_dir, users.homes):
        passable.mkdir(parents=True, exist_ok=True)
        os.chmod(passable, 0o711)
    os.chown(settings.data, 0, gid)
    os.chmod(settings.data, 0o3775)
    settings.registry.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.registry, 0o700)
    needed = [Path(sys.executable), Path(sys.base_prefix) / "lib", *code_paths, settings.data]
    closed = unix_users.closed_ancestors([*needed, users.homes, settings.sweeps_dir])
    granted = unix_users.grant_passage(gid, closed)
    if granted:
        # A Python under /root/.pyenv, a checkout in a closed home: people's processes must
        # pass those directories to run it; passing is all they get (no listing, no reading).
        print("tunehub: people's processes may now pass (not list or read) "
              + ", ".join(map(str, granted)) + " (ACL, execute only)", flush=True)
    blocked = unix_users.unreachable(needed, gid, passable=[users.homes, settings.sweeps_dir])
    if blocked:
        raise CliError(
            f"people's servers and trials run as their own users, who cannot reach {blocked}; "
            "let others pass the directories above it (chmod o+x), put TUNEHUB_HOME and "
            f"TUNEHUB_DATA somewhere shared (e.g. /srv/tunehub), or set "
            f"{unix_users.ENV_ENABLED}=0 (no isolation between people)")

"""Two people with real Unix users on a data store laid out as ``tunehub up`` lays it out, and a
way to act as either of them (a forked child that drops to their user, as the platform's own
children do)."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hub_fixtures import REPO, system_users_for_test
from tunehub_base.settings import Settings, load_settings
from tunehub_base.unix_users import UnixUser, UnixUsers, privilege_dropper


@dataclass
class Store:
    settings: Settings
    users: UnixUsers
    attacker: UnixUser

    @property
    def data(self) -> Path:
        return self.settings.data


def as_user(user: UnixUser, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run as ``user`` in a child process; its result, or the exception it raised
    (re-raised here, so ``pytest.raises`` sees what that person's own process met)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read_end)
            privilege_dropper(user)()
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # handed to the parent, which raises it
            outcome = (False, exc)
        try:
            os.write(write_end, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """As root: a home and data store as ``tunehub up`` lays them out for people with Unix
    users (the data root ``root:<group>`` 3775), the settings in the environment as the hub
    and the tuner have them, and the attacker's account (``mallory``) with its Unix user."""
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    with system_users_for_test() as (base, env):
        assert base is not None
        from tuner.cli import isolation

        home, data = base / "tunehub", base / "data"
        for key, value in {**env, "TUNEHUB_HOME": str(home), "TUNEHUB_DATA": str(data),
                           "TUNEHUB_UNIX_USERS": "1", "TUNEHUB_MODE": "local"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("TUNEHUB_DB_URL", raising=False)
        monkeypatch.delenv("TUNEHUB_USERS_DIR", raising=False)
        settings = load_settings().ensure_dirs()
        umask = os.umask(0o022)
        try:  # isolation.prepare sets the platform's umask (077) for what follows it
            isolation.prepare(settings, home / "hub", [REPO, Path(sys.executable).parent])
        finally:
            os.umask(umask)
        users = UnixUsers.from_env(home)
        yield Store(settings, users, users.ensure("mallory"))

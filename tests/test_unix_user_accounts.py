"""System users of accounts (real ``useradd`` as root): names that are safe and never collide,
never reusing a user that is not tunehub's (``root`` included), homes only their owner can
open, and a deleted account locked with its processes gone and its files kept."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_fixtures import system_users_for_test
from tests.polling import wait_for
from tunehub_base.unix_users import MARK, RETIRED_SHELL, UnixUserError, UnixUsers
from tuner.backends.local.ownership import chown_tree


@pytest.fixture
def users() -> Iterator[UnixUsers]:
    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    with system_users_for_test() as (base, env):
        assert base is not None
        yield UnixUsers(base / "users", env["TUNEHUB_UNIX_USER_PREFIX"],
                        env["TUNEHUB_UNIX_GROUP"])


def test_login_names_are_safe_short_and_distinct(users: UnixUsers) -> None:
    assert users.login_name("alice") == users.prefix + "alice"
    dotted, underscored = users.login_name("a.b"), users.login_name("a_b")
    assert dotted != underscored and "." not in dotted
    long_a, long_b = users.login_name("x" * 31 + "a"), users.login_name("x" * 31 + "b")
    assert long_a != long_b and len(long_a) <= 32 and len(long_b) <= 32


def test_an_account_gets_a_private_home_and_its_user_is_reused_only_if_ours(
    users: UnixUsers,
) -> None:
    alice = users.ensure("alice")
    entry = pwd.getpwnam(alice.login)
    assert entry.pw_gecos == MARK + "alice" and alice.uid != 0
    st = alice.home.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o700)
    assert stat.S_IMODE(users.homes.stat().st_mode) == 0o711
    assert users.group in {g for g in _groups(alice.login)}
    assert users.ensure("alice") == alice  # idempotent: same user, same home

    # A user at that login that is not ours (made by hand) is never taken over.
    taken = users.login_name("mallory")
    subprocess.run(["useradd", "--system", "--no-create-home", taken], check=True)
    with pytest.raises(UnixUserError, match="already exists and is not tunehub's"):
        users.ensure("mallory")
    assert users.lookup("mallory") is None
    with pytest.raises(UnixUserError, match="has no system user"):
        users.require("mallory")

    # Not even root, whatever the prefix.
    bare = UnixUsers(users.homes, prefix="", group=users.group)
    with pytest.raises(UnixUserError, match="not tunehub's"):
        bare.ensure("root")
    assert bare.lookup("root") is None
    for bad in ("../etc", "Alice", "", "a" * 40):
        with pytest.raises(UnixUserError, match="not a valid account name"):
            users.ensure(bad)


def test_retiring_kills_its_processes_locks_it_and_keeps_its_files(users: UnixUsers) -> None:
    bob = users.ensure("bob")
    (bob.home / "notes.txt").write_text("keep me")
    proc = subprocess.Popen(["sleep", "600"], user=bob.uid, group=bob.gid)
    users.retire("bob")
    wait_for(lambda: proc.poll() is not None, timeout=30, what="bob's process to be killed")
    assert pwd.getpwnam(bob.login).pw_shell == RETIRED_SHELL
    with pytest.raises(UnixUserError, match="was deleted"):
        users.require("bob")
    assert (bob.home / "notes.txt").read_text() == "keep me"
    # The same account made again gets its user (and files) back.
    assert users.ensure("bob").retired is False


def test_sealing_artifacts_drops_links_and_never_follows_them(
    users: UnixUsers, tmp_path: Path
) -> None:
    """What a trial leaves for the registry becomes root's, read-only, without links: a link
    to a secret can neither be copied out nor have its target's owner changed."""
    carol = users.ensure("carol")
    secret = tmp_path / "secret"
    secret.write_text("platform secret")
    os.chmod(secret, 0o600)
    art = users.homes / "art"
    (art / "model" / "variables").mkdir(parents=True)
    (art / "model" / "saved_model.pb").write_bytes(b"pb")
    (art / "model" / "variables" / "leak").symlink_to(secret)
    (art / "link-dir").symlink_to(tmp_path, target_is_directory=True)
    chown_tree(art, carol.uid, carol.gid, dir_mode=0o700)
    assert (art / "model" / "saved_model.pb").stat().st_uid == carol.uid
    assert secret.stat().st_uid == 0 and tmp_path.stat().st_uid == 0  # links not followed
    chown_tree(art, 0, 0, dir_mode=0o755)
    assert not (art / "link-dir").is_symlink() and not (art / "link-dir").exists()
    assert not (art / "model" / "variables" / "leak").exists()
    st = (art / "model" / "saved_model.pb").stat()
    assert st.st_uid == 0 and not st.st_mode & 0o022
    assert secret.read_text() == "platform secret" and secret.stat().st_uid == 0


def _groups(login: str) -> list[str]:
    import grp

    entry = pwd.getpwnam(login)
    return [grp.getgrgid(g).gr_name for g in os.getgrouplist(login, entry.pw_gid)]


def test_roots_default_home_is_one_others_can_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's ``~`` is closed to others, so its default home is ``/var/lib/tunehub``; an
    existing ``~/.tunehub`` of root's is kept (its state is not silently left behind)."""
    from tunehub_base.settings import SYSTEM_HOME, load_settings

    assert os.geteuid() == 0, "this test needs root (the suite runs as root on this machine)"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings({}).home == SYSTEM_HOME
    (tmp_path / ".tunehub").mkdir()
    assert load_settings({}).home == tmp_path / ".tunehub"
    assert load_settings({"TUNEHUB_HOME": str(tmp_path / "x")}).home == tmp_path / "x"


def test_up_finds_what_people_cannot_reach_and_names_the_closed_directory(
    users: UnixUsers,
) -> None:
    from tunehub_base.unix_users import unreachable

    gid = users.group_id()
    open_dir = users.homes.parent / "shared"
    closed = users.homes.parent / "private"
    for d, mode in ((open_dir, 0o755), (closed, 0o700)):
        d.mkdir()
        os.chmod(d, mode)
        (d / "python").write_text("")
        os.chmod(d / "python", 0o755)
    (open_dir / "link").symlink_to(closed / "python")
    assert unreachable([open_dir / "python", open_dir], gid) is None
    found = unreachable([open_dir / "python", open_dir / "link"], gid)
    assert found == f"{open_dir / 'link'} (Permission denied; {closed} is closed to others)"


def test_people_logging_in_at_the_same_moment_all_get_their_users(users: UnixUsers) -> None:
    """useradd refuses at once while another useradd holds /etc/passwd's lock; accounts made
    at the same moment (two people logging in, the hub and the tuner) must all succeed."""
    from concurrent.futures import ThreadPoolExecutor

    names = [f"p{i}" for i in range(8)]
    with ThreadPoolExecutor(len(names)) as pool:
        made = list(pool.map(users.ensure, names + names))  # each twice, at once
    assert {u.login for u in made} == {users.login_name(n) for n in names}
    for name in names:
        assert pwd.getpwnam(users.login_name(name)).pw_gecos == MARK + name


def test_passage_given_to_platforms_at_once_is_taken_back_one_by_one(users: UnixUsers) -> None:
    """Test suites (and platforms) running at once each grant their own group passage on the
    same closed directory (``/root`` for a pyenv Python). Each takes back its own entry only:
    one platform stopping must not close the directory to another's people (their servers
    then failed to start with an HTTP 500, "Permission denied" running Python)."""
    from concurrent.futures import ThreadPoolExecutor

    from tunehub_base.unix_users import grant_passage, revoke_passage, unreachable

    closed = users.homes.parent / "private"
    closed.mkdir()
    os.chmod(closed, 0o700)
    python = closed / "python"
    python.write_text("")
    os.chmod(python, 0o755)
    ours, others = users.group_id(), [60000 + i for i in range(6)]  # gids of other platforms

    earlier = grant_passage(others[0], [closed])  # a platform that started before ours
    assert grant_passage(ours, [closed]) == [closed]
    with ThreadPoolExecutor(len(others)) as pool:  # others come and go meanwhile, at once
        granted = list(pool.map(lambda gid: grant_passage(gid, [closed]), others[1:]))
        assert all(unreachable([python], gid) is None for gid in [ours, *others])
        list(pool.map(revoke_passage, others[1:], granted))
    revoke_passage(others[0], earlier)  # the earlier one stops while ours still runs
    assert unreachable([python], ours) is None, "another platform's exit closed ours"
    assert all(unreachable([python], gid) for gid in others), "an entry was left behind"

    revoke_passage(ours, [closed])
    assert unreachable([python], ours) == f"{python} (Permission denied; {closed} is closed " \
        "to others)"

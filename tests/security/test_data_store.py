"""The data store's shape is the platform's, and a sweep's code is copied without following links
(issue #31, items 2 and 9, and the ``code`` check's existence oracle of item 7).

As root with real Unix users: the attacker (``mallory``) acts through processes running as her
own Unix user; the platform's side is the code the hub and the tuner run (account provisioning,
the ``code`` check, the snapshot copied as its owner)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.hub_fixtures import Platform
from tests.polling import wait_for
from tests.security import _data_store_fixtures
from tests.security._data_store_fixtures import Store, as_user
from tests.test_hub_platform import login_token
from tunehub_base import datastore
from tunehub_base.accounts import provision_system_user
from tunehub_base.unix_users import UnixUser, privilege_dropper
from tuner.backends.local.ownership import snapshot_as
from tuner.snapshot import (
    CodeSource,
    check_service_code,
    code_owner,
    copy_snapshot,
    snapshot_ignore,
)
from tuner.spec import SpecError

store = _data_store_fixtures.store  # the fixture, by its name in this module

PAYLOAD = "import os; print(open(f'/proc/{os.getppid()}/environ').read())\n"


def _make_tree(root: str, files: dict[str, str], mode: int = 0o755) -> None:
    """Directories and files under ``root`` (run as their owner)."""
    for rel, text in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=mode)
        path.write_text(text)


def _try_write(path: str) -> str:
    """Create ``path``; the error's name when refused (run as the attacker)."""
    try:
        Path(path).write_text(PAYLOAD)
    except OSError as exc:
        return type(exc).__name__
    return "written"


def _victim(st: Store, name: str = "victim") -> UnixUser:
    """An account made as the hub makes one (its Unix user and its area of the data store)."""
    provision_system_user(name)
    user = st.users.lookup(name)
    assert user is not None
    return user


def test_an_area_someone_made_before_the_account_is_set_aside(store: Store) -> None:
    """mallory creates ``users/`` and ``users/victim`` (0777, her ``train.py`` inside) and
    ``users/carol`` as a link to her own directory before those accounts exist, and keeps a
    process sitting in ``users/victim``. Once the platform has made its shape, the accounts'
    areas are new directories of their own, 0700, empty; she can write in neither, not even
    through the directory her process still holds."""
    data, mallory = store.data, store.attacker
    users = data / "users"

    def plant() -> None:
        os.mkdir(users, 0o777)
        os.chmod(users, 0o777)
        os.mkdir(users / "victim", 0o777)
        os.chmod(users / "victim", 0o777)
        _make_tree(str(users / "victim"), {"proj/train.py": PAYLOAD}, 0o777)
        (data / "mallory-carol").mkdir()
        (users / "carol").symlink_to(data / "mallory-carol")

    as_user(mallory, plant)
    gate = data / "gate"
    holder = subprocess.Popen(  # waits in users/victim, then writes into it by its cwd
        [sys.executable, "-c", "import os, pathlib, time\n"
         f"gate = pathlib.Path({str(gate)!r})\n"
         "print('ready', flush=True)\n"
         "while not gate.exists():\n    time.sleep(0.05)\n"
         "try:\n    open('planted.py', 'w').write('x')\n    print('written', flush=True)\n"
         "except OSError as e:\n    print(type(e).__name__, flush=True)\n"],
        cwd=users / "victim", preexec_fn=privilege_dropper(mallory), stdout=subprocess.PIPE,
        text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"

    # tunehub up claims users/; then the accounts are made (up, the hub's admin panel).
    datastore.prepare(store.settings)
    victim, carol = _victim(store), _victim(store, "carol")

    st = os.lstat(users)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711)
    for person in (victim, carol):
        area = users / person.account
        st = os.lstat(area)
        assert stat.S_ISDIR(st.st_mode), f"{area} is not a directory of its own"
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
            (person.uid, person.gid, 0o700)
        assert os.listdir(area) == [], "what mallory left must not be in the person's area"
    aside = [p for p in os.listdir(users) if p.startswith(".taken-back-")]
    assert len(aside) == 2, os.listdir(users)

    # mallory can write in neither area, nor add a new one for the next account.
    for path in (users / "victim" / "train.py", users / "carol" / "train.py",
                 users / "dave"):
        assert as_user(mallory, _try_write, str(path)) == "PermissionError", path
    gate.touch()
    out, _ = holder.communicate(timeout=60)
    assert out.strip() == "PermissionError", "her process's directory is set aside, root's"
    assert os.listdir(users / "victim") == []


def test_an_area_of_its_own_keeps_its_files_and_loses_what_others_could_do(
    store: Store,
) -> None:
    """The person's own area (they own it) is kept with its files; group and world lose write;
    an area root made for them (not writable by others) becomes theirs."""
    victim = _victim(store)
    area = store.data / "users" / "victim"
    as_user(victim, _make_tree, str(area), {"proj/train.py": "print(1)\n"})
    os.chmod(area, 0o777)
    provision_system_user("victim")  # the next tunehub up
    assert os.listdir(area) == ["proj"]
    assert stat.S_IMODE(os.lstat(area).st_mode) == 0o750  # group read kept, the group theirs
    os.mkdir(store.data / "users" / "erin", 0o755)  # an operator's mkdir before the account
    (store.data / "users" / "erin" / "notes").write_text("kept")
    erin = _victim(store, "erin")
    st = os.lstat(store.data / "users" / "erin")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (erin.uid, 0o750)
    assert (store.data / "users" / "erin" / "notes").read_text() == "kept"


def test_examples_someone_made_before_seeding_are_set_aside(store: Store) -> None:
    """``examples/`` is seeded by root: mallory's directory there (or a link to one) would have
    root copy into a place she controls, and people run her ``digits``. ``tunehub up`` claims
    it first: what she made is set aside and the seeded example is root's."""
    from tuner.cli.examples import seed_examples

    def plant() -> None:
        _make_tree(str(store.data / "examples"), {"digits/train.py": PAYLOAD}, 0o777)
        os.chmod(store.data / "examples", 0o777)

    as_user(store.attacker, plant)
    datastore.prepare(store.settings)
    assert "digits" in seed_examples(store.settings)
    examples = store.data / "examples"
    for path in (examples, examples / "digits", examples / "digits" / "train.py"):
        st = os.lstat(path)
        assert st.st_uid == 0 and not st.st_mode & 0o022, path
    assert PAYLOAD not in (examples / "digits" / "train.py").read_text()


def test_code_that_someone_else_can_change_is_refused(store: Store) -> None:
    """A ``code`` path with a directory on its way that someone else owns, or that others may
    write to, is a 400 on ``code``; so is a file inside it another person owns. The sticky
    data root (3775) on the way is fine."""
    victim = _victim(store)
    owner = code_owner(store.settings, "victim")
    data, mallory = store.data, store.attacker
    proj = data / "users" / "victim" / "proj"
    as_user(victim, _make_tree, str(proj), {"train.py": "print(1)\n"})
    assert check_service_code(str(proj), store.settings, "victim", owner).path == proj
    # The notebook's ~/data, a link of theirs to the data store, leads there as well.
    home_link = victim.home / "data"
    as_user(victim, os.symlink, str(data), str(home_link))
    via_home = home_link / "users" / "victim" / "proj"
    assert check_service_code(str(via_home), store.settings, "victim", owner).path == proj

    def refused(code: Path, why: str) -> None:
        with pytest.raises(SpecError) as err:
            check_service_code(str(code), store.settings, "victim", owner)
        assert err.value.field == "code" and why in err.value.message, err.value

    os.chmod(proj, 0o777)  # as if the victim had: everyone could add a sitecustomize.py
    refused(proj, "is writable by others")
    os.chmod(proj, 0o755)
    # A shared directory of mallory's, the victim's project inside it (she can swap it).
    as_user(mallory, lambda: (os.mkdir(data / "team"), os.chmod(data / "team", 0o777)))
    as_user(victim, _make_tree, str(data / "team" / "p"), {"train.py": "print(1)\n"})
    refused(data / "team" / "p", "belongs to someone else")
    # The victim's own shared directory, group-writable: the group (tunehub) is everyone.
    as_user(victim, _make_tree, str(data / "vproj"), {"train.py": "print(1)\n"})
    os.chmod(data / "vproj", 0o775)
    assert os.lstat(data / "vproj").st_gid != victim.gid  # inherited from the setgid root
    refused(data / "vproj", "is writable by others")
    os.chmod(data / "vproj", 0o755)
    assert check_service_code(str(data / "vproj"), store.settings, "victim", owner)
    # A file inside planted by someone else: the copy (as the victim) refuses the snapshot.
    source = check_service_code(str(proj), store.settings, "victim", owner)
    (proj / "helpers.py").write_text(PAYLOAD)
    os.chown(proj / "helpers.py", mallory.uid, mallory.gid)
    target = store.settings.sweeps_dir / "incoming" / "code"
    with pytest.raises(SpecError, match="helpers.py belongs to someone else"):
        snapshot_as(victim, source, target, snapshot_ignore(store.settings, "victim"), {})


def test_a_directory_swapped_for_a_link_after_the_check_copies_nothing_of_its_target(
    store: Store,
) -> None:
    """The check passes; then a middle directory of ``code`` becomes a link to a directory the
    owner can read but that is no code of theirs (the race of item 9). The copy walks again
    from the data root and refuses; nothing of the target lands in the snapshot. The same for a
    subdirectory swapped between the copy's listing and its opening."""
    victim = _victim(store)
    owner = code_owner(store.settings, "victim")
    area = store.data / "users" / "victim"
    as_user(victim, _make_tree, str(area), {
        "proj/src/train.py": "print(1)\n", "proj/src/pkg/lib.py": "X = 1\n",
        "elsewhere/src/train.py": "SECRET\n", "elsewhere/src/pkg/lib.py": "SECRET\n"})
    source = check_service_code(str(area / "proj" / "src"), store.settings, "victim", owner)

    def swap(directory: Path) -> None:
        os.rename(directory, directory.with_name(directory.name + ".old"))
        os.symlink(area / "elsewhere" / directory.relative_to(area / "proj"), directory)

    as_user(victim, swap, area / "proj")
    ignore = snapshot_ignore(store.settings, "victim")
    for copy in (  # as the owner (one machine), and in the tuner's own process (Kubernetes)
        lambda t: snapshot_as(victim, source, t, ignore, {}),
        lambda t: copy_snapshot(CodeSource(source.root, source.parts), t, ignore, 10**6),
    ):
        target = store.settings.sweeps_dir / f".incoming-{os.urandom(4).hex()}" / "code"
        with pytest.raises(SpecError, match="is a link or not a directory"):
            copy(target)
        assert not [p for p in target.parent.rglob("*") if p.is_file()], "nothing copied"
    as_user(victim, lambda: (os.unlink(area / "proj"),
                             os.rename(area / "proj.old", area / "proj")))

    # Between listing a directory and opening its entries (the ignore hook runs there).
    def swapping(directory: str, names: list[str]) -> set[str]:
        if directory == str(source.path):
            swap(area / "proj" / "src" / "pkg")
        return set(ignore(directory, names))

    target = store.settings.sweeps_dir / "race" / "code"
    copy_snapshot(source, target, swapping, 10**6)
    copied = {str(p.relative_to(target)): p for p in target.rglob("*")}
    assert set(copied) == {"train.py"}, copied
    assert "SECRET" not in (target / "train.py").read_text()


def test_a_fifo_in_the_code_does_not_hang_the_snapshot(store: Store) -> None:
    """A FIFO in the code directory, and a file swapped for a FIFO after the listing, are
    skipped: the snapshot (as its owner) ends, with the regular files in it."""
    victim = _victim(store)
    owner = code_owner(store.settings, "victim")
    proj = store.data / "users" / "victim" / "proj"
    as_user(victim, _make_tree, str(proj), {"train.py": "print(1)\n", "late.py": "x\n"})
    as_user(victim, os.mkfifo, str(proj / "pipe"))
    source = check_service_code(str(proj), store.settings, "victim", owner)
    ignore = snapshot_ignore(store.settings, "victim")

    def fifo_after_listing(directory: str, names: list[str]) -> set[str]:
        os.unlink(proj / "late.py")
        os.mkfifo(proj / "late.py")
        os.chown(proj / "late.py", victim.uid, victim.gid)
        return set(ignore(directory, names))

    target = store.settings.sweeps_dir / "fifo" / "code"
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            snapshot_as(victim, source, target, fifo_after_listing, {})
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    wait_for(done.is_set, timeout=30, what="the snapshot to end despite the FIFOs")
    assert not errors, errors
    assert sorted(os.listdir(target)) == ["train.py"]


def test_the_code_check_tells_nobody_whether_a_path_in_another_area_exists(
    store: Store,
) -> None:
    """mallory asks for code in the victim's area, in a directory of the victim's that she
    cannot open, and in one of root's she cannot open: the answer is the same whether the
    path exists or not."""
    victim = _victim(store)
    data = store.data
    as_user(victim, _make_tree, str(data / "users" / "victim"), {"proj/train.py": "x\n"})
    as_user(victim, _make_tree, str(data / "vsecret"), {"proj/train.py": "x\n"})
    os.chmod(data / "vsecret", 0o700)
    (data / "private" / "proj").mkdir(parents=True)
    os.chmod(data / "private", 0o700)
    owner = code_owner(store.settings, "mallory")

    def answer(code: Path) -> str:
        with pytest.raises(SpecError) as err:
            check_service_code(str(code), store.settings, "mallory", owner)
        assert err.value.field == "code"
        return err.value.message.replace(str(code), "<code>")

    for parent in (data / "users" / "victim", data / "vsecret", data / "private"):
        existing, missing = parent / "proj", parent / "nope"
        assert answer(existing) == answer(missing), parent
        assert answer(existing / "deeper") == answer(missing / "deeper"), parent
        # Through links of her own: resolved with her rights, which stop at the same place.
        links = {}
        for target in (existing, missing):
            link = data / f"mlink-{parent.name}-{len(links)}"
            as_user(store.attacker, os.symlink, str(target), str(link))
            links[target] = answer(link).replace(str(target), "<code>")
        assert len(set(links.values())) == 1, links
    assert answer(data / "users" / "victim") == answer(data / "users" / "nobody")


def test_on_a_running_platform_areas_are_made_for_people_and_the_code_check_says_nothing(
    platform: Platform,
) -> None:
    """The whole platform (``tunehub up`` as root, accounts made through the hub's API, sweeps
    submitted over HTTP with each person's token). mallory's Unix user exists from an earlier
    run, and she planted ``users/victim`` (0777, her ``train.py`` in it) before the victim's
    account existed. After ``tunehub up`` and the account: the victim's area is a fresh one of
    theirs; mallory can write in it no more than make another; she cannot tell which paths in it
    exist; and the victim's own code directory that everyone may write to is a 400 on ``code``."""
    import grp

    from tunehub_base.unix_users import UnixUsers

    people = UnixUsers.from_env(platform.home, platform.env)
    gid = people.group_id()
    platform.data.mkdir(parents=True, exist_ok=True)
    os.chown(platform.data, 0, gid)  # the data store as an earlier tunehub up left it
    os.chmod(platform.data, 0o3775)
    assert grp.getgrgid(gid).gr_name == platform.env["TUNEHUB_UNIX_GROUP"]
    mallory = people.ensure("mallory")

    def plant() -> None:
        (platform.data / "users" / "victim").mkdir(parents=True)
        for path in (platform.data / "users", platform.data / "users" / "victim"):
            os.chmod(path, 0o777)
        _make_tree(str(platform.data / "users" / "victim"), {"proj/train.py": PAYLOAD})

    as_user(mallory, plant)
    platform.start()
    assert platform.password, platform.output
    hub = httpx.Client(base_url=platform.url + "hub/api/", timeout=60, headers={
        "Authorization": f"token {login_token(platform.url, 'admin', platform.password)}"})
    r = hub.post("users", json={"usernames": ["mallory", "victim"]})
    assert r.status_code == 201, r.text

    def tuner(user: str) -> httpx.Client:
        r = hub.post(f"users/{user}/tokens", json={"note": "data store test"})
        assert r.status_code == 201, r.text
        return httpx.Client(base_url=platform.url + "services/tuner/api/v1/", timeout=60,
                            headers={"Authorization": f"token {r.json()['token']}"})

    victim = people.lookup("victim")
    assert victim is not None
    users, area = platform.data / "users", platform.data / "users" / "victim"
    assert (os.lstat(users).st_uid, stat.S_IMODE(os.lstat(users).st_mode)) == (0, 0o711)
    st = os.lstat(area)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (victim.uid, 0o700)
    assert os.listdir(area) == []
    for path in (area / "train.py", users / "zed"):
        assert as_user(mallory, _try_write, str(path)) == "PermissionError", path

    as_user(victim, _make_tree, str(area), {"proj/train.py": "print(1)\n"})
    theirs, hers = tuner("victim"), tuner("mallory")

    def submit(client: httpx.Client, code: Path) -> httpx.Response:
        return client.post("sweeps", json={"spec": {
            "name": "t", "code": str(code), "command": "python train.py", "metric": "m",
            "trials": 1, "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}}})

    answers = set()
    for code in (area / "proj", area / "nope", area / "proj" / "deeper", area):
        r = submit(hers, code)
        assert r.status_code == 400 and r.json()["field"] == "code", r.text
        answers.add(r.json()["error"].replace(str(code), "<code>"))
    assert len(answers) == 1, answers
    as_user(victim, os.chmod, str(area / "proj"), 0o777)
    r = submit(theirs, area / "proj")
    assert r.status_code == 400 and r.json()["field"] == "code", r.text
    assert "is writable by others" in r.json()["error"], r.text
    assert theirs.get("sweeps").json() == [] and hers.get("sweeps").json() == []

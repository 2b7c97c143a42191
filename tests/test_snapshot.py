"""Code snapshots: where a service user's code may come from, and a copy that never follows a
link out of the snapshot (real files, links and FIFOs on disk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunehub_base.settings import load_settings
from tuner.snapshot import check_service_code, copy_snapshot, snapshot_ignore
from tuner.spec import SpecError, SweepSpec

SPEC = {"name": "t", "command": "python t.py", "metric": "m",
        "space": {"x": {"type": "float", "low": 0, "high": 1}}}


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """The chart's layout: tunehub's home inside the data store, per-user areas beside it."""
    data = tmp_path / "data"
    home = data / ".tunehub"
    for d in (home / "sweeps" / "7" / "code", data / "users" / "alice" / "proj",
              data / "users" / "bob" / "secret", data / "datasets", data / "models"):
        d.mkdir(parents=True)
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "token").write_text("the tuner's ServiceAccount token")
    return {"data": data, "home": home, "secret": secret, "tmp": tmp_path}


def settings_for(layout: dict[str, Path]):  # noqa: ANN201 -- a Settings
    return load_settings({"TUNEHUB_HOME": str(layout["home"]), "TUNEHUB_DATA": str(layout["data"])})


def test_service_code_must_be_the_callers_part_of_the_data_store(
    layout: dict[str, Path],
) -> None:
    s, data = settings_for(layout), layout["data"]
    assert check_service_code(str(data / "users" / "alice" / "proj"), s, "alice").path == (
        data / "users" / "alice" / "proj").resolve()
    assert check_service_code(str(data / "datasets"), s, "alice").path == (data / "datasets")
    link = data / "users" / "alice" / "sa"
    link.symlink_to(layout["secret"])  # a link inside the data store to the tuner's secrets
    refused = {
        str(layout["secret"]): "outside the data store",
        str(link): "outside the data store",
        str(link / "token"): "outside the data store",
        "/var/run/secrets/kubernetes.io/serviceaccount": "outside the data store",
        "/etc": "outside the data store",
        str(layout["home"]): "tunehub's own state",
        str(layout["home"] / "sweeps" / "7" / "code"): "tunehub's own state",
        str(data / "models"): "tunehub's own state",
        str(data / "users" / "bob" / "secret"): "not in your area",
        str(data / "users" / "alice" / ".." / "bob"): "not in your area",
        "users/alice/proj": "expected an absolute path",
        str(data / "users" / "alice" / "proj" / "missing"): "does not exist",
    }
    for code, why in refused.items():
        with pytest.raises(SpecError) as err:
            check_service_code(code, s, "alice")
        assert err.value.field == "code" and why in err.value.message, (code, err.value)
        assert str(data) in err.value.message  # says where code may live


@pytest.mark.parametrize("layout_name", ["default", "data is the home", "home inside data"])
def test_state_is_refused_and_the_data_store_allowed_in_every_layout(
    tmp_path: Path, layout_name: str
) -> None:
    """The rule depends on neither default: with only ``TUNEHUB_HOME`` set (the data store is
    ``$TUNEHUB_HOME/data``), every state directory of the home is refused and the data store,
    the seeded examples among it, is allowed; a data store that is the home allows nothing of
    it; a home inside the data store is refused and the rest of the store allowed."""
    home = tmp_path / "home"
    env = {"TUNEHUB_HOME": str(home)}
    if layout_name == "data is the home":
        env["TUNEHUB_DATA"] = str(home)
    elif layout_name == "home inside data":
        home = tmp_path / "data" / ".tunehub"
        env = {"TUNEHUB_HOME": str(home), "TUNEHUB_DATA": str(tmp_path / "data")}
    s = load_settings(env).ensure_dirs()
    state = [s.home, s.sweeps_dir / "3" / "code", s.home / "hub", s.home / "users" / "alice",
             s.registry / "digits"]
    for d in [*state, s.examples_dir / "digits", s.data / "users" / "alice" / "proj"]:
        d.mkdir(parents=True, exist_ok=True)
    for code in state:
        with pytest.raises(SpecError, match="tunehub's own state"):
            check_service_code(str(code), s, "alice")
    allowed = [s.examples_dir / "digits", s.data / "users" / "alice" / "proj"]
    for code in allowed:
        if layout_name == "data is the home":
            with pytest.raises(SpecError, match="tunehub's own state"):
                check_service_code(str(code), s, "alice")
        else:
            assert check_service_code(str(code), s, "alice").path == code.resolve()


def test_snapshot_copies_no_link_leaving_it(layout: dict[str, Path]) -> None:
    src, secret = layout["data"] / "users" / "alice" / "proj", layout["secret"]
    (src / "pkg").mkdir()
    (src / "train.py").write_text("print('hi')")
    (src / "pkg" / "lib.py").write_text("X = 1")
    (src / "inside").symlink_to("pkg/lib.py")  # relative, inside: kept
    (src / "absolute-inside").symlink_to(src / "pkg")  # absolute into the code: kept, rewritten
    (src / "token").symlink_to(secret / "token")  # outside: left out
    (src / "secrets").symlink_to(secret)  # a directory outside: left out
    (src / "climb").symlink_to("../../bob/secret")  # escapes by ..: left out
    (src / "chain").symlink_to("token")  # to a link leaving it: left out
    os.mkfifo(src / "pipe")  # a FIFO would block a naive copy: not code
    target = layout["tmp"] / "snap" / "code"
    dropped = copy_snapshot(src, target, snapshot_ignore(settings_for(layout), "alice"), 10**6)

    assert sorted(dropped) == ["chain", "climb", "secrets", "token"]
    assert sorted(p.name for p in target.iterdir()) == ["absolute-inside", "inside", "pkg",
                                                        "train.py"]
    assert (target / "inside").read_text() == "X = 1"
    assert os.readlink(target / "absolute-inside") == "pkg"
    assert (target / "absolute-inside" / "lib.py").read_text() == "X = 1"
    for path in target.rglob("*"):
        assert target.resolve() in path.resolve().parents or path.resolve() == target.resolve()


def test_snapshot_of_the_data_root_leaves_out_state_and_other_users(
    layout: dict[str, Path],
) -> None:
    data = layout["data"]
    (data / "users" / "alice" / "proj" / "a.py").write_text("")
    (data / "users" / "bob" / "secret" / "b.py").write_text("")
    (data / ".tunehub" / "tuner-cookie-secret").write_text("x")
    target = layout["tmp"] / "snap"
    copy_snapshot(data, target, snapshot_ignore(settings_for(layout), "alice"), 10**6)
    names = {str(p.relative_to(target)) for p in target.rglob("*")}
    assert "users/alice/proj/a.py" in names
    assert not any(n.startswith(("users/bob", ".tunehub")) for n in names), names


def test_snapshot_stops_at_the_size_limit(layout: dict[str, Path]) -> None:
    src = layout["data"] / "users" / "alice" / "proj"
    (src / "big.bin").write_bytes(b"\0" * 5000)
    with pytest.raises(SpecError) as err:
        copy_snapshot(src, layout["tmp"] / "snap", snapshot_ignore(settings_for(layout)), 4096)
    assert err.value.field == "code"


@pytest.mark.parametrize("name", [
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TF_CONFIG", "TUNEHUB_TRIAL_TOKEN",
    "TUNEHUB_DATA", "JUPYTERHUB_API_TOKEN", "cuda_visible_devices", "HOME",
])
def test_spec_env_cannot_set_what_the_platform_owns(name: str) -> None:
    with pytest.raises(SpecError) as err:
        SweepSpec.from_dict({**SPEC, "env": {name: "0,1"}})
    assert err.value.field == f"env.{name}"
    assert SweepSpec.from_dict({**SPEC, "env": {"DIGITS_EPOCHS": "3"}}).env == {
        "DIGITS_EPOCHS": "3"}


def test_spec_refuses_nul_characters() -> None:
    with pytest.raises(SpecError) as err:
        SweepSpec.from_dict({**SPEC, "metric": "m\x00"})
    assert err.value.field == "metric"

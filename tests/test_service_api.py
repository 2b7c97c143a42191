"""The tuner service behind a real JupyterHub: scoped hub tokens, per-user isolation, JSON
errors, function sweeps from the notebook client, OpenAPI and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_for
from tests.service_fixtures import TunerHub
from tests.sweeps_helpers import write_sweep
from tuner.spec import SpecError

SCRIPT = """
import tuner
p = tuner.params()
for step in range(1, 3):
    tuner.report(p["x"] * step, step=step)
"""
READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]


def _spec(data: Path, **changes: Any) -> dict[str, Any]:
    """A sweep whose code lies in the data store, where the service takes code from."""
    import yaml

    path = write_sweep(data / "code", SCRIPT, trials=3, parallelism=2, **changes)
    spec = yaml.safe_load(path.read_text())
    spec["code"] = str(path.parent)
    return spec


def _wait_finished(client: httpx.Client, sweep_id: int) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        data = client.get(f"sweeps/{sweep_id}").json()
        return data if data["state"] in ("completed", "failed", "cancelled") else None

    return wait_for(finished, timeout=120, what=f"sweep {sweep_id} to finish")


def test_users_see_and_change_only_their_own_sweeps(tuner_hub: TunerHub, tmp_path: Path) -> None:
    alice = tuner_hub.client(tuner_hub.token("alice", READ_SUBMIT))
    bob = tuner_hub.client(tuner_hub.token("bob", READ_SUBMIT))
    boss = tuner_hub.client(tuner_hub.token("boss", READ_SUBMIT + ["custom:tuner:admin"]))

    r = alice.post("sweeps", json={"spec": _spec(tuner_hub.data)})
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert sweep["owner"] == "alice"
    done = _wait_finished(alice, sweep["id"])
    assert done["state"] == "completed" and done["completed"] == 3

    trials = alice.get(f"sweeps/{sweep['id']}/trials").json()
    assert len(trials) == 3
    assert [v["step"] for v in trials[0]["intermediate_values"]] == [1, 2]
    log = alice.get(f"sweeps/{sweep['id']}/trials/0/logs")
    assert log.status_code == 200 and "attempt 1" in log.text

    # Bob: the sweep does not exist for him.
    for method, path in [("GET", f"sweeps/{sweep['id']}"), ("POST", f"sweeps/{sweep['id']}/cancel"),
                         ("GET", f"sweeps/{sweep['id']}/trials"),
                         ("GET", f"sweeps/{sweep['id']}/trials/0/logs")]:
        r = bob.request(method, path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"] == f"sweep {sweep['id']} not found"
    assert bob.get("sweeps").json() == []
    # An admin sees everyone's.
    assert [s["id"] for s in boss.get("sweeps").json()] == [sweep["id"]]


def test_scopes_and_bad_requests(tuner_hub: TunerHub, tmp_path: Path) -> None:
    reader = tuner_hub.client(
        tuner_hub.token("carol", ["custom:tuner:read", "access:services!service=tuner"])
    )
    r = reader.post("sweeps", json={"spec": _spec(tuner_hub.data)})
    assert r.status_code == 403
    assert r.json()["error"] == "this token lacks the scope custom:tuner:submit"
    assert reader.get("sweeps").status_code == 200

    anonymous = httpx.get(f"{tuner_hub.api}sweeps", timeout=30)
    assert anonymous.status_code == 401 and "error" in anonymous.json()

    writer = tuner_hub.client(tuner_hub.token("carol", READ_SUBMIT))
    bad = _spec(tuner_hub.data)
    bad["space"]["x"]["low"] = 5
    r = writer.post("sweeps", json={"spec": bad})
    assert r.status_code == 400
    assert r.json()["field"] == "space.x.low"
    assert writer.post("sweeps", content=b"{nope").status_code == 400
    r = writer.post("sweeps", json={"spec": _spec(tuner_hub.data), "colour": 1})
    assert r.status_code == 400
    r = writer.post("sweeps", json={"spec": _spec(tuner_hub.data, resources={"gpu": 2})})
    assert r.status_code == 400 and r.json()["field"] == "resources.gpu"
    assert writer.get("sweeps/999999").status_code == 404
    assert writer.get("sweeps").json() == []  # nothing stored by the refused requests


def test_notebook_client_runs_a_function_sweep(
    tuner_hub: TunerHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tuner

    monkeypatch.setenv("TUNEHUB_API_URL", tuner_hub.url + "services/tuner/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", tuner_hub.token("dana", READ_SUBMIT))

    offset = 0.25  # captured by the closure, shipped with cloudpickle

    def objective(params: dict) -> float:
        return -((params["x"] - offset) ** 2)

    sweep = tuner.Sweep.submit(
        name="fn", metric="score", trials=4, parallelism=2, seed=3,
        space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, function=objective,
    )
    again = tuner.Sweep.get(sweep.id)  # as after a kernel restart
    again.watch(interval=0.2, timeout=120)
    assert again.state == "completed"
    frame = again.trials()
    assert len(frame) == 4 and set(frame["state"]) == {"completed"}
    for _, row in frame.iterrows():
        assert row["value"] == pytest.approx(-((row["params_x"] - 0.25) ** 2))
    assert again.best["value"] == frame["value"].max()
    figures = again.plot()
    assert figures["history"].data and "importance" in figures

    with pytest.raises(SpecError, match="space: is required"):
        tuner.Sweep.submit(name="fn", metric="m", space={}, function=objective)
    # Code comes only from the data store, whatever the notebook can name.
    for code, why in (("/etc", "outside the data store"),
                      (tuner_hub.env["TUNEHUB_HOME"], "tunehub's own state")):
        with pytest.raises(SpecError, match=why) as err:
            tuner.Sweep.submit(name="cmd", metric="m", command="python x.py", code=code,
                               space={"x": {"type": "float", "low": 0.0, "high": 1.0}})
        assert err.value.field == "code"

    # A sweep whose trials keep failing stops early; watch() ends with why.
    def broken(params: dict) -> float:
        raise ValueError(f"no data for x={params['x']:.2f}")

    capsys.readouterr()
    failing = tuner.Sweep.submit(
        name="fn-broken", metric="score", trials=30, parallelism=1,
        space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, function=broken,
    )
    failing.watch(interval=0.2, timeout=120)
    assert failing.state == "failed" and failing.info["failed"] == 3
    printed = capsys.readouterr().out
    assert f"sweep {failing.id} failed: stopped after 3 failed trials" in printed
    assert "ValueError: no data for x=" in printed


def test_openapi_and_metrics(tuner_hub: TunerHub) -> None:
    from openapi_spec_validator import validate

    doc = httpx.get(f"{tuner_hub.api}openapi.json", timeout=30).json()
    validate(doc)
    assert "/sweeps/{sweep_id}/cancel" in doc["paths"]
    # The scrape needs a hub token with read:metrics (tests/security/test_names_and_logins.py
    # has the refusals).
    metrics = httpx.get(f"{tuner_hub.url}services/tuner/metrics", timeout=30,
                        headers={"Authorization": f"Bearer {tuner_hub.admin_token}"}).text
    assert "tunehub_trials_finished_total" in metrics

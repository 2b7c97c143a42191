"""Kubernetes mode: what a user's sweep can reach, through the real hub and tuner service with
the Kubernetes backend against the API emulator (kubesim).

The chart's layout puts tunehub's home inside the data volume (``<data>/.tunehub``) beside the
users' areas, and the tuner pod holds a ServiceAccount token and the database URL. A user's
``code`` can name none of them, a link in the code to them is not copied, and the trial's pod
mounts only the shared datasets, its sweep's code and its own trial directory, with no
ServiceAccount token and none of the tuner's settings in its environment. (The emulator runs
pods as local processes that see the host's filesystem, so the mounts are checked on the Job
the tuner created, not by reading.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesim import KubeCluster
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub

pytestmark = [pytest.mark.slow]

READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]
PROBE = """\
import os, pathlib, time, tuner
print("SEEN", sorted(os.listdir(".")))
for name in ("sa", "home", "hub"):
    try:
        print("READ", name, [p.read_text() for p in pathlib.Path(name).iterdir()])
    except OSError as exc:
        print("CANNOT", name, type(exc).__name__)
print("ENV", sorted(k for k in os.environ if k.startswith("JUPYTERHUB")
                    or k in ("KUBECONFIG", "TUNEHUB_DB_URL", "TUNEHUB_HOME")))
gate = pathlib.Path(os.environ["GATE"])
while not gate.exists():
    time.sleep(0.1)
tuner.report(1.0)
"""


def test_a_sweep_reaches_no_platform_secret(kube: KubeCluster, tmp_path: Path) -> None:
    for value, priority in ((10, "low"), (100, "normal"), (500, "high")):
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": f"tunehub-sweep-{priority}"}, "value": value})
    data = kube.data_dir
    # What the tuner pod has and a trial must never see: its ServiceAccount token, and the
    # hub's state, both outside the data volume; tunehub's home inside it.
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("SA-TOKEN-SECRET")
    hub_state = tmp_path / "hub-state"
    hub_state.mkdir()
    (hub_state / "jupyterhub_cookie_secret").write_text("HUB-COOKIE-SECRET")
    env = {
        "TUNEHUB_BACKENDS": "kubernetes",
        "KUBECONFIG": str(kube.kubeconfig),
        "TUNEHUB_DATA": str(data),
        "TUNEHUB_HOME": str(data / ".tunehub"),
    }
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tuner.sqlite'}", env) as hub:
        (data / ".tunehub" / "tuner-cookie-secret").write_bytes(b"TUNER-COOKIE-SECRET")
        alice = hub.client(hub.token("alice", READ_SUBMIT))
        code = data / "users" / "alice" / "probe"
        code.mkdir(parents=True)
        (code / "train.py").write_text(PROBE)
        (code / "sa").symlink_to(sa)
        (code / "home").symlink_to("../../../.tunehub")
        (code / "hub").symlink_to(hub_state)
        base = {"name": "probe", "command": "python train.py", "metric": "m", "trials": 1,
                "space": {"x": {"type": "float", "low": 0, "high": 1}},
                "resources": {"cpu": 0.1, "memory": "256Mi"}}

        # code naming the platform's state is refused, naming code and where code may live.
        for where in (sa, hub_state, data / ".tunehub", data / ".tunehub" / "sweeps",
                      code / "sa", code / "home"):
            r = alice.post("sweeps", json={"spec": {**base, "code": str(where)}})
            assert r.status_code == 400 and r.json()["field"] == "code", (where, r.text)
            assert str(data) in r.json()["error"]

        gate = tmp_path / "gate"
        r = alice.post("sweeps", json={"spec": {**base, "code": str(code),
                                                "env": {"GATE": str(gate)}}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        snapshot = data / ".tunehub" / "sweeps" / str(sid) / "code"
        assert sorted(p.name for p in snapshot.iterdir()) == ["train.py"]

        jobs = wait_for(lambda: kube.objects("jobs", label_selector=f"tunehub.io/sweep={sid}"),
                        timeout=120, what="the trial's Job")
        pod = jobs[0]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        (ctr,) = pod["containers"]
        sweep = data / ".tunehub" / "sweeps" / str(sid)
        assert [(m["mountPath"], m.get("readOnly", False)) for m in ctr["volumeMounts"]] == [
            (str(data / "datasets"), True),
            (str(sweep / "code"), True),
            (str(sweep / "trials" / "0"), False),
        ]
        names = {e["name"] for e in ctr["env"]}
        assert not {n for n in names if n.startswith("JUPYTERHUB") or n == "KUBECONFIG"}
        assert "TUNEHUB_DB_URL" not in names and "TUNEHUB_HOME" not in names
        assert {e["name"]: e.get("value") for e in ctr["env"]}["NVIDIA_VISIBLE_DEVICES"] == \
            "none"
        gate.touch()

        done = wait_for(lambda: (v := alice.get(f"sweeps/{sid}").json())["state"]
                        in ("completed", "failed") and v, timeout=180, what="the sweep")
        assert done["state"] == "completed", done
        log = alice.get(f"sweeps/{sid}/trials/0/logs").text
        for secret in ("SA-TOKEN-SECRET", "HUB-COOKIE-SECRET", "TUNER-COOKIE-SECRET"):
            assert secret not in log, log
        assert "SEEN" in log and "'sa'" not in log.split("SEEN", 1)[1].split("\n")[0], log
        assert all(f"CANNOT {n} FileNotFoundError" in log for n in ("sa", "home", "hub")), log
        assert "ENV []" in log, log

"""Kubernetes isolation (#31 items 8, 10, 11, 12), against the API emulator over real HTTP.

- A trial runs as another uid than the tuner and cannot turn its ``trial.log`` into a link to
  the tuner's ServiceAccount token or ``/proc/self/environ``: its directory is handed to it
  sticky, the log stays the tuner's, and the tuner writes the pods' output (from the log API)
  without following links.
- Every attempt is a network island: a NetworkPolicy per Job, owned by it, selecting exactly
  its pods; no policy admits another sweep's pods; the trial's way to the tuner and DNS holds.
- The tuner's ServiceAccount can neither read nor change nor delete the admin Secret.
- Two releases in one namespace never delete each other's Jobs; cluster-scoped names differ
  per namespace and release.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubesim import KubeCluster
from kubesim.waiting import eventually
from tests.chart_security import TUNER_ACCOUNT, tuner_kubeconfig
from tests.polling import wait_for
from tests.security._kubernetes_isolation_fixtures import (
    ANY_PORT,
    kubeconfig_token,
    matches,
    reachable,
    uid_cluster,
)
from tests.test_hub_kube_config import example_values, render
from tests.test_kubernetes_backend import Events, launch
from tuner.backends._base import TrialLaunch
from tuner.backends.kubernetes import KubernetesBackend, KubeSettings
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.workdir import append_log
from tuner.spec import Resources, SpecError

pytestmark = [pytest.mark.slow]

TRIAL_UID = 1000  # the chart's sweeps.runAsUser, TUNEHUB_K8S_RUN_AS_USER's default


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Any:
    with uid_cluster(monkeypatch) as kube:
        yield kube


def held_launch(kube: KubeCluster, gate: Path, sweep: int = 3, trial: int = 7,
                **kw: Any) -> TrialLaunch:
    """An attempt whose workers wait for ``gate`` (so their pods are alive while looked at)."""
    script = (f"import os, time; [time.sleep(0.05) for _ in iter(lambda: os.path.exists("
              f"{str(gate)!r}), True)]; print('released')")
    la = launch(kube.data_dir, trial=trial, command=f"python -c {json.dumps(script)}", **kw)
    workdir = la.workdir.parent.parent.parent / str(sweep) / "trials" / str(trial)
    workdir.mkdir(parents=True, exist_ok=True)
    return replace(la, sweep_id=sweep, workdir=workdir, log_path=workdir / "trial.log")


# --- item 8: the trial's uid, its directory and its log -----------------------------------

ATTACK = """\
import os
SECRET = {secret!r}
def attempt(what, act):
    try:
        act()
        print(what, "DONE")
    except OSError as exc:
        print(what, "REFUSED", type(exc).__name__)
def swap(target, tmp):
    os.symlink(target, tmp)
    os.rename(tmp, "trial.log")
print("uid", os.getuid())
attempt("unlink", lambda: os.remove("trial.log"))
attempt("link-token", lambda: swap(SECRET, "a"))
attempt("link-environ", lambda: swap("/proc/self/environ", "b"))
attempt("write", lambda: open("trial.log", "a").write("FORGED\\n"))
attempt("output", lambda: open("output.txt", "w").write("mine"))
attempt("model", lambda: open("artifacts/model.txt", "w").write("mine"))
print("HELLO FROM THE TRIAL")
"""


async def test_a_trial_cannot_link_its_log_to_the_tuners_secrets(
        cluster: KubeCluster, tmp_path: Path) -> None:
    # What the tuner's pod holds and a trial must never print through the logs API: its
    # ServiceAccount token (root-only here, as it is the tuner's) and its environment.
    secrets_dir = tmp_path / "serviceaccount"
    secrets_dir.mkdir(mode=0o700)
    token = secrets_dir / "token"
    token.write_text("SA-TOKEN-SECRET")
    environ = Path("/proc/self/environ").read_bytes()[:64]

    be = KubernetesBackend.from_env()
    assert be.settings.run_as_user == TRIAL_UID != os.geteuid()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        la = launch(cluster.data_dir, trial=1, command="python attack.py")
        la.workdir.mkdir(parents=True)
        (la.workdir / "artifacts").mkdir()
        (la.workdir / "attack.py").write_text(ATTACK.format(secret=str(token)))
        la.log_path.write_text("=== tunehub: trial 1, attempt 1 ===\n")  # the controller's
        await be.launch(la)
        final = await events.final(1)
        assert final.kind == "succeeded", final
    finally:
        await be.close()

    # The log is still the tuner's regular file; what the logs API serves is its bytes.
    st = la.log_path.lstat()
    assert la.log_path.is_file() and not la.log_path.is_symlink() and st.st_uid == os.geteuid()
    served = la.log_path.read_bytes()
    text = served.decode()
    assert b"SA-TOKEN-SECRET" not in served and environ not in served, text
    assert f"uid {TRIAL_UID}" in text, text  # the trial ran as the trial uid, not the tuner's
    for what in ("unlink", "link-token", "link-environ", "write"):
        assert f"{what} REFUSED" in text, text
    # ...while its own directory stays its to write (the handover works).
    assert "output DONE" in text and "model DONE" in text, text
    assert "HELLO FROM THE TRIAL" in text and "FORGED" not in text
    assert text.startswith("=== tunehub: trial 1, attempt 1 ===\n")

    # And were a link there anyway (a cluster whose volume ignores the sticky bit), the tuner
    # appends through nothing: it neither follows it nor writes the target.
    la.log_path.unlink()
    la.log_path.symlink_to(token)
    assert append_log(cluster.data_dir, la.log_path, "pod output\n") is False
    assert token.read_text() == "SA-TOKEN-SECRET"
    # Nor does a linked directory above the log lead it anywhere.
    moved = la.workdir.with_name("moved")
    la.workdir.rename(moved)
    la.workdir.symlink_to(secrets_dir)
    with pytest.raises(OSError):
        append_log(cluster.data_dir, la.workdir / "token", "pod output\n")
    assert token.read_text() == "SA-TOKEN-SECRET"


TRAIN = """\
import os, tuner
for target, tmp in (({secret!r}, "a"), ("/proc/self/environ", "b")):
    try:
        os.symlink(target, tmp)
        os.rename(tmp, "trial.log")
        print("LINKED", target)
    except OSError as exc:
        print("REFUSED", type(exc).__name__)
print("TRIAL OUTPUT")
tuner.report(1.0)
"""


def test_the_logs_api_prints_none_of_the_tuners_secrets(
        cluster: KubeCluster, tmp_path: Path) -> None:
    """The same attack through the real hub and tuner service and the logs route."""
    from tests.service_fixtures import running_tuner_hub

    secrets_dir = tmp_path / "serviceaccount"
    secrets_dir.mkdir(mode=0o700)
    (secrets_dir / "token").write_text("SA-TOKEN-SECRET")
    data = cluster.data_dir
    env = {key: os.environ[key] for key in ("KUBECONFIG", "TUNEHUB_K8S_RUN_AS_GROUP",
                                            "TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT")}
    env.update(TUNEHUB_BACKENDS="kubernetes", TUNEHUB_DATA=str(data),
               TUNEHUB_HOME=str(data / ".tunehub"), TUNER_SECRET_MARKER="ENV-SECRET-MARKER")
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tuner.sqlite'}", env) as hub:
        alice = hub.client(hub.token("alice", ["custom:tuner:read", "custom:tuner:submit",
                                               "access:services!service=tuner"]))
        code = data / "users" / "alice" / "attack"
        code.mkdir(parents=True)
        (code / "train.py").write_text(TRAIN.format(secret=str(secrets_dir / "token")))
        r = alice.post("sweeps", json={"spec": {
            "name": "attack", "command": "python train.py", "metric": "m", "trials": 1,
            "code": str(code), "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "resources": {"cpu": 0.1, "memory": "256Mi"}}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        view = wait_for(lambda: (v := alice.get(f"sweeps/{sid}").json())["state"]
                        in ("completed", "failed") and v, timeout=180, what="the sweep")
        assert view["state"] == "completed", view
        log = alice.get(f"sweeps/{sid}/trials/0/logs").text
    assert "TRIAL OUTPUT" in log and "LINKED" not in log, log
    assert log.count("REFUSED PermissionError") == 2, log
    for secret in ("SA-TOKEN-SECRET", "ENV-SECRET-MARKER", "KUBECONFIG="):
        assert secret not in log, log


def test_trial_pods_mount_only_their_own_directory_and_run_as_another_uid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = KubeSettings(namespace="tunehub", data_path=tmp_path)
    la = launch(tmp_path, trial=7)
    pod = m.job(s, la)["spec"]["template"]["spec"]
    sweep = tmp_path / ".tunehub" / "sweeps" / "3"
    assert [(v["mountPath"], v.get("readOnly", False)) for v in
            pod["containers"][0]["volumeMounts"]] == [
        (str(tmp_path / "datasets"), True), (str(sweep / "code"), True),
        (str(sweep / "trials" / "7"), False)]
    assert pod["securityContext"]["runAsUser"] == TRIAL_UID
    pod_sc = pod["securityContext"]
    assert pod_sc["fsGroup"] == pod_sc["runAsGroup"] == s.run_as_group
    # The tuner refuses to run trials as itself (as root, uid 0 is never a trial's: the
    # tuner is made to see itself as uid 4242 for this one call).
    own = os.geteuid() or 4242
    with monkeypatch.context() as mp, pytest.raises(SpecError, match="RUN_AS_USER"):
        mp.setattr(os, "geteuid", lambda: own)
        KubeSettings.from_env({"TUNEHUB_K8S_RUN_AS_USER": str(own),
                               "TUNEHUB_DATA": str(tmp_path)})
    # ...and so does the chart; by default they differ, and the tuner is in the trials' group.
    objects = render(example_values())
    tuner = next(o for o in objects if o["kind"] == "Deployment"
                 and o["metadata"]["name"].endswith("-tuner"))["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in tuner["containers"][0]["env"]}
    assert int(env["TUNEHUB_K8S_RUN_AS_USER"]) != tuner["securityContext"]["runAsUser"]
    assert int(env["TUNEHUB_K8S_RUN_AS_GROUP"]) == tuner["securityContext"]["fsGroup"]
    import helm_python as helm

    same = example_values()
    same.setdefault("tuner", {})["uid"] = 1000
    same.setdefault("sweeps", {})["runAsUser"] = 1000
    with pytest.raises(helm.HelmError, match="tuner.uid and sweeps.runAsUser"):
        render(same)


# --- item 10: one network island per attempt ----------------------------------------------

async def test_each_attempt_is_its_own_network_island(cluster: KubeCluster) -> None:
    # The chart's release-wide policies too: what is evaluated is everything in the namespace.
    cluster.apply([o for o in render(example_values()) if o["kind"] == "NetworkPolicy"])
    gate = cluster.data_dir / "gate"
    be = KubernetesBackend.from_env()
    events = Events()
    be.subscribe(events)
    await be.start()
    try:
        two = Resources(workers=2)
        first = held_launch(cluster, gate, sweep=3, trial=1, resources=two)
        other = held_launch(cluster, gate, sweep=4, trial=2, resources=two, owner="bob")
        await be.launch(first)
        await be.launch(other)

        def pods_of(job: str) -> list[dict[str, Any]]:
            return cluster.objects("pods", label_selector=f"batch.kubernetes.io/job-name={job}")

        names = [m.job_name(be.settings, la.sweep_id, la.trial_id, 1) for la in (first, other)]
        async def all_running() -> bool:
            return all(len(ps := pods_of(n)) == 2 and all(
                (p.get("status") or {}).get("phase") == "Running" for p in ps) for n in names)

        await eventually(all_running, 60, "both attempts' two workers running")
        jobs = {n: cluster.get("jobs", n, group="batch") for n in names}
        pods = {n: pods_of(n) for n in names}
        assert all(len(p) == 2 for p in pods.values()), pods
        policies = cluster.objects("networkpolicies", group="networking.k8s.io")
        everyone = [p for ps in pods.values() for p in ps]
        for name, job in jobs.items():
            assert job is not None
            (own,) = [p for p in policies if p["metadata"]["name"] == name]
            assert own["metadata"]["ownerReferences"] == [m.owner_reference(job)]
            selected = {p["metadata"]["name"] for p in everyone
                        if matches(own["spec"]["podSelector"], p["metadata"]["labels"])}
            assert selected == {p["metadata"]["name"] for p in pods[name]}
        # Workers of one attempt reach each other on every port (TF, NCCL); nobody else.
        (a1, a2), (b1, b2) = pods[names[0]], pods[names[1]]
        assert reachable(policies, a1, a2) == {ANY_PORT}
        assert reachable(policies, b2, b1) == {ANY_PORT}
        for src, dst in ((a1, b1), (b1, a1), (a2, b2), (b2, a1)):
            assert reachable(policies, src, dst) == set(), (src["metadata"]["name"],
                                                            dst["metadata"]["name"])
        assert not [e for e in events.seen if e.final], events.seen  # all alive meanwhile
        # What a trial reached before still holds: the tuner's report route, DNS.
        tuner_pod = {"metadata": {"name": "tuner", "labels": {
            "app.kubernetes.io/name": "tunehub", "app.kubernetes.io/instance": "tunehub",
            "app.kubernetes.io/component": "tuner"}}}
        assert ("TCP", 8082) in (reachable(policies, a1, tuner_pod) or set())
        dns = {"metadata": {"name": "coredns", "labels": {"k8s-app": "kube-dns"}}}
        assert ("UDP", 53) in (reachable(policies, a1, dns) or set())
        # The policy goes with its Job.
        await be.cancel(first.trial_id, 1)
        def policies_left() -> list[str]:
            return [p["metadata"]["name"] for p in
                    cluster.objects("networkpolicies", group="networking.k8s.io")]

        async def collected() -> bool:
            return names[0] not in policies_left()

        await eventually(collected, 30, "the cancelled Job's NetworkPolicy to go with it")
        assert names[1] in policies_left()
    finally:
        gate.touch()
        await be.close()


async def test_an_adopted_job_from_before_islands_gets_its_policy(cluster: KubeCluster) -> None:
    """A Job a tuner made before per-attempt islands (no NetworkPolicy) is given one when a
    restarted tuner adopts it, or its workers could not reach each other."""
    gate = cluster.data_dir / "gate"
    first = KubernetesBackend.from_env()
    await first.start()
    la = held_launch(cluster, gate, sweep=3, trial=1)
    name = m.job_name(first.settings, 3, 1, 1)
    try:
        await first.launch(la)
    finally:
        await first.close()
    server, token = kubeconfig_token(cluster.kubeconfig)  # the cluster admin
    r = httpx.delete(f"{server}/apis/networking.k8s.io/v1/namespaces/{cluster.namespace}/"
                     f"networkpolicies/{name}", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    second = KubernetesBackend.from_env()
    await second.start()
    try:
        assert await second.reconcile(3, [la]) == {(1, 1)}
        (policy,) = [p for p in cluster.objects("networkpolicies", group="networking.k8s.io")
                     if p["metadata"]["name"] == name]
        job = cluster.get("jobs", name, group="batch")
        assert job is not None
        assert policy["metadata"]["ownerReferences"] == [m.owner_reference(job)]
    finally:
        gate.touch()
        await second.close()


# --- item 11: the tuner and the namespace's Secrets ---------------------------------------

def test_the_tuner_can_neither_read_nor_change_the_admin_secret(cluster: KubeCluster) -> None:
    cluster.create({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "tunehub-hub-admin"},
                    "stringData": {"password": "ADMIN-PASSWORD"}})
    server, token = kubeconfig_token(tuner_kubeconfig(cluster))
    base = f"{server}/api/v1/namespaces/{cluster.namespace}/secrets"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(headers=headers, timeout=30) as http:
        for method, url, body, ctype in (
            ("PATCH", f"{base}/tunehub-hub-admin", {}, "application/merge-patch+json"),
            ("PATCH", f"{base}/tunehub-hub-admin", {"stringData": {"password": "mine"}},
             "application/merge-patch+json"),
            ("GET", f"{base}/tunehub-hub-admin", None, None),
            ("GET", base, None, None),
            ("DELETE", f"{base}/tunehub-hub-admin", None, None),
            ("PUT", f"{base}/tunehub-hub-admin", {"apiVersion": "v1", "kind": "Secret",
                                                   "metadata": {"name": "tunehub-hub-admin"},
                                                   "stringData": {"password": "mine"}},
             "application/json"),
        ):
            r = http.request(method, url, content=None if body is None else json.dumps(body),
                             headers={"Content-Type": ctype} if ctype else {})
            assert r.status_code == 403, (method, url, r.status_code, r.text)
            assert "ADMIN-PASSWORD" not in r.text
        # What it does need: creating an attempt's own Secret.
        r = http.post(base, json={"apiVersion": "v1", "kind": "Secret",
                                  "metadata": {"name": "tunehub-s1-t1-a1-token"},
                                  "stringData": {"token": "t"}})
        assert r.status_code == 201, r.text
    admin = cluster.get("secrets", "tunehub-hub-admin")
    assert admin is not None and "password" in (admin.get("data") or admin.get("stringData"))
    rules = [(g, res, verb) for g, res, verb in cluster.granted(TUNER_ACCOUNT)
             if res == "secrets"]
    assert rules == [("", "secrets", "create")]


# --- item 12: two releases, cluster-scoped names ------------------------------------------

async def test_two_releases_in_one_namespace_never_delete_each_others_jobs(
        cluster: KubeCluster) -> None:
    gate = cluster.data_dir / "gate"
    ours = KubernetesBackend.from_env()
    theirs = KubernetesBackend(KubeSettings.from_env({**os.environ,
                                                      "TUNEHUB_K8S_INSTANCE": "lab-b"}))
    our_events, their_events = Events(), Events()
    ours.subscribe(our_events)
    theirs.subscribe(their_events)
    await ours.start()
    await theirs.start()
    try:
        # The same sweep, trial and attempt numbers in both releases' databases.
        la = held_launch(cluster, gate, sweep=3, trial=7)
        await ours.launch(la)
        await theirs.launch(la)
        jobs = cluster.objects("jobs", group="batch")
        by_instance = {j["metadata"]["labels"]["app.kubernetes.io/instance"]:
                       j["metadata"]["name"] for j in jobs}
        assert set(by_instance) == {"tunehub", "lab-b"} and len(set(by_instance.values())) == 2
        # Everything each tuner created carries its release and is named after it.
        for plural, group in (("jobs", "batch"), ("secrets", ""),
                              ("networkpolicies", "networking.k8s.io")):
            made = cluster.objects(plural, group=group,
                                   label_selector="app.kubernetes.io/managed-by=tunehub")
            assert len(made) == 2, (plural, made)
            for obj in made:
                release = obj["metadata"]["labels"]["app.kubernetes.io/instance"]
                assert obj["metadata"]["name"].startswith(f"{release}-s3-t7-a1"), obj
        # Everything one release does to "sweep 3" (reconcile deletes every Job of the sweep
        # it does not keep, cleanup, cancel) leaves the other's Job alone.
        await ours.reconcile(3, [])
        await ours.cleanup(3)
        await ours.cancel(7, 1)
        assert (await our_events.final(7)).kind == "failed"
        left = {j["metadata"]["name"]: j for j in cluster.objects("jobs", group="batch")}
        assert by_instance["tunehub"] not in left or left[by_instance["tunehub"]]["metadata"].get(
            "deletionTimestamp")
        theirs_job = left[by_instance["lab-b"]]
        assert not theirs_job["metadata"].get("deletionTimestamp")
        assert not [e for e in their_events.seen if e.final]
        gate.touch()
        done = await their_events.final(7)
        assert done.kind == "succeeded", done
    finally:
        gate.touch()
        await ours.close()
        await theirs.close()


CLUSTER_SCOPED = {"PriorityClass", "ClusterQueue", "ResourceFlavor", "ClusterRole",
                  "ClusterRoleBinding", "WorkloadPriorityClass"}


def test_cluster_scoped_names_differ_per_namespace_and_release() -> None:
    values = example_values()
    values.setdefault("kueue", {})["enabled"] = True

    def names(namespace: str, release: str) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"])
                for o in render(values, namespace=namespace, release=release)
                if o["kind"] in CLUSTER_SCOPED}

    installs = {(ns, rel): names(ns, rel)
                for ns, rel in (("lab", "tunehub"), ("lab2", "tunehub"), ("lab", "other"))}
    assert all(len(n) >= 5 for n in installs.values()), installs
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for install, objs in installs.items():
        for obj in objs:
            assert obj not in seen, f"{obj} rendered by both {seen[obj]} and {install}"
            seen[obj] = install


def test_notebook_preemption_policy_is_configurable() -> None:
    def notebook_class(policy: str | None) -> dict[str, Any]:
        values = example_values()
        if policy:
            values.setdefault("priorityClasses", {})["notebook"] = {
                "value": 1000, "preemptionPolicy": policy}
        (pc,) = [o for o in render(values) if o["kind"] == "PriorityClass"
                 and o["metadata"]["labels"]["tunehub.io/priority-role"] == "notebook"]
        return pc

    default, never = notebook_class(None), notebook_class("Never")
    assert default["preemptionPolicy"] == "PreemptLowerPriority"
    assert never["preemptionPolicy"] == "Never"
    # Immutable on the API server: a changed policy is a new class, never a failing patch.
    assert default["metadata"]["name"] != never["metadata"]["name"]

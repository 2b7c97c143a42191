"""tunehub's three container images, built from this repository with buildah and run.

The images are built exactly as ``images/build.sh`` builds them for an operator, with one
difference: the upstream bases (python:3.12.8-slim-bookworm, tensorflow/tensorflow:2.21.0-gpu)
cannot be pulled here, so ``images/standin/bases.sh`` makes stand-ins from a debootstrapped
Debian bookworm and they are passed as the ``PYTHON_IMAGE`` / ``TF_IMAGE`` build arguments.
Each image then runs its smoke command as a pod would run it (its entrypoint, its user, host
networking) with ``buildah run --isolation chroot``:

- hub: the chart's ``jupyterhub_config.py`` in Kubernetes mode, with the env and volumes of the
  hub Deployment the Helm chart renders, loads and gives KubeSpawner the chart's notebook image;
  ``jupyterhub --help-all`` runs;
- notebook: ``jupyterhub-singleuser`` starts and answers its REST API to a user token checked by
  a real JupyterHub, and refuses a request without one;
- trial: a sweep run by the real tuner (``tunehub sweep run``) whose trials run inside the image,
  train a Keras model with the image's TensorFlow and report to the tuner over loopback HTTP;
  the best model is registered.

Everything is cached between runs in ``TUNEHUB_IMAGE_CACHE`` (default
``/var/cache/tunehub-images``): the debootstrapped root filesystem, buildah's storage (layers,
overlay driver) and pip's wheel cache (the Dockerfiles' cache mounts). Needs root, buildah and
debootstrap (``make test`` installs them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, Home
from tests.polling import wait_for
from tests.service_fixtures import TunerHub, free_port
from tests.test_hub_kube_config import NAMESPACE, find, hub_values, minimal_values, render

# Cold builds (debootstrap, TensorFlow, three images) take minutes; warm ones seconds.
pytestmark = pytest.mark.timeout(1800)

CACHE = Path(os.environ.get("TUNEHUB_IMAGE_CACHE", "/var/cache/tunehub-images"))
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
STANDIN_PYTHON = "localhost/tunehub-standin/python:bookworm"
STANDIN_TF = "localhost/tunehub-standin/tensorflow:2.21.0"
# Before a container's command runs, buildah re-executes itself from a sealed in-memory copy of
# its binary (containers/storage's unshare code; Debian's buildah 1.28 has no other way). The
# kernel refuses the seal (EBUSY) while it still holds a transient reference to a page of that
# fresh copy, which a machine busy with three test workers makes just likely enough to fail one
# run in many (seen once in CI). Nothing has started in the container then, so the suite runs
# such a command again, a bounded number of times; any other failure counts at once.
BUILDAH_TRANSIENT = "sealing memfd copy: Device or resource busy"
BUILDAH_TRIES = 3


def failed_transiently(returncode: int | None, output: str) -> bool:
    return returncode not in (None, 0) and BUILDAH_TRANSIENT in output


STORAGE_CONF = """\
[storage]
driver = "{driver}"
runroot = "{runroot}"
graphroot = "{graphroot}"
"""


def chart_images() -> tuple[str, str]:
    """The registry prefix and tag the chart's values give the three images: the suite builds
    exactly those names (in its own storage; nothing is pushed)."""
    images = yaml.safe_load((REPO / "helm/tunehub/values.yaml").read_text())["images"]
    repos = {images[n]["repository"].rsplit("/", 1)[0] for n in ("hub", "notebook", "trial")}
    tags = {str(images[n]["tag"]) for n in ("hub", "notebook", "trial")}
    assert len(repos) == 1 and len(tags) == 1, images
    assert all(images[n]["repository"].endswith("/" + n) for n in ("hub", "notebook", "trial"))
    return repos.pop(), tags.pop()


class Images:
    """The built images, and running commands in fresh containers of them."""

    def __init__(self, env: dict[str, str], registry: str, tag: str) -> None:
        self.env = env  # CONTAINERS_STORAGE_CONF and TMPDIR: our storage, not the system's
        self.registry, self.tag = registry, tag

    def name(self, image: str) -> str:
        return f"{self.registry}/{image}:{self.tag}"

    def buildah(self, *args: str, timeout: float = 300) -> str:
        proc = self.capture(["buildah", *args], timeout)
        if proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {proc.stderr[-3000:]}")
        return proc.stdout

    def config(self, image: str) -> dict[str, Any]:
        """The OCI image config (User, Entrypoint, Env, ...)."""
        out = json.loads(self.buildah("inspect", "--type", "image", self.name(image)))
        return dict(out["OCIv1"]["config"])

    def capture(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Runs a buildah command to its end, again when it failed transiently."""
        for _ in range(BUILDAH_TRIES):
            proc = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                  timeout=timeout)
            if not failed_transiently(proc.returncode, proc.stderr):
                break
        return proc

    @contextmanager
    def container(self, image: str) -> Iterator[str]:
        ctr = self.buildah("from", self.name(image)).strip()
        try:
            yield ctr
        finally:
            kill_processes_of(ctr)
            self.buildah("rm", ctr)

    def run_argv(self, ctr: str, image: str, command: list[str],
                 env: dict[str, str] | None = None,
                 volumes: dict[Path, str] | None = None) -> list[str]:
        """``buildah run`` as a pod runs the image: its entrypoint (tini) before ``command``,
        its user and working directory, host networking."""
        argv = ["buildah", "run", "--isolation", "chroot", "--network", "host",
                "--env", f"{MARKER}={ctr}"]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        for host, inside in (volumes or {}).items():
            argv += ["--volume", f"{host}:{inside}"]
        return [*argv, ctr, "--", *(self.config(image).get("Entrypoint") or []), *command]

    def run(self, image: str, command: list[str], timeout: float = 300,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        with self.container(image) as ctr:
            return self.capture(self.run_argv(ctr, image, command, **kwargs), timeout)


MARKER = "TUNEHUB_TEST_CONTAINER"


def kill_processes_of(ctr: str) -> None:
    """SIGKILL whatever still runs in container ``ctr`` (found by the marker variable every
    run gives it): the container's processes are not in ``buildah run``'s process group, so
    stopping ``buildah run`` alone can leave them behind."""
    marker = f"{MARKER}={ctr}\0".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone meanwhile


def build_step(argv: list[str], env: dict[str, str], log: Path) -> None:
    """Runs a build script, again after a transient failure of one of its RUN steps (the
    layers built before it are cached, so the next try resumes there)."""
    for _ in range(BUILDAH_TRIES):
        with open(log, "w") as fh:
            proc = subprocess.run(argv, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
        if not failed_transiently(proc.returncode, log.read_text()):
            break
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def images() -> Images:
    """The three images built from the repository on the stand-in bases (cached layers)."""
    assert os.geteuid() == 0, "building images with buildah here needs root (as make test has)"
    for tool in ("buildah", "debootstrap"):
        assert shutil.which(tool), f"{tool} is missing: make test installs it"
    (CACHE / "tmp").mkdir(parents=True, exist_ok=True)
    # overlay: layers shared, not copied (vfs, for filesystems without overlay, is ~2x slower and
    # ~2x the disk).
    driver = os.environ.get("TUNEHUB_IMAGE_DRIVER", "overlay")
    suffix = "" if driver == "overlay" else f"-{driver}"
    conf = CACHE / f"storage{suffix}.conf"
    graphroot = CACHE / f"storage{suffix}"
    # Run state (mounts, locks) belongs on /run, which a reboot empties; one per storage.
    runroot = Path("/run/tunehub-images") / hashlib.sha256(bytes(graphroot)).hexdigest()[:12]
    conf.write_text(STORAGE_CONF.format(driver=driver, graphroot=graphroot, runroot=runroot))
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf),
           # buildah keeps RUN --mount=type=cache directories (pip's wheels) under TMPDIR.
           "TMPDIR": str(CACHE / "tmp")}
    registry, tag = chart_images()
    build = {**env, "PYTHON_IMAGE": STANDIN_PYTHON, "TF_IMAGE": STANDIN_TF,
             "REGISTRY": registry, "TAG": tag}
    if CA_BUNDLE.exists():  # this network re-signs TLS: pip in RUN steps must trust its CA
        build["CA_BUNDLE"] = str(CA_BUNDLE)
        env["BUILDAH_BUD_FLAGS"] = f"--volume {CA_BUNDLE}:{CA_BUNDLE}:ro"
    build_step([str(REPO / "images/standin/bases.sh"), str(CACHE)], env, CACHE / "bases.log")
    build_step([str(REPO / "images/build.sh")], build, CACHE / "build.log")
    return Images(env, registry, tag)


def check_pod_shape(images: Images, image: str) -> None:
    """Non-root by default, tini in front of the command, and the CA bundle bind-mounted into
    the build's RUN steps not left behind in the image."""
    config = images.config(image)
    assert config["User"] == "1000:100"
    assert config["Entrypoint"] == ["tini", "-g", "--"]
    out = images.run(image, ["sh", "-c", "id -u; id -g; command -v tini; "
                                        f"sha256sum {CA_BUNDLE} || echo none"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[:2] == ["1000", "100"] and lines[2].endswith("/tini")
    if CA_BUNDLE.exists():
        host = hashlib.sha256(CA_BUNDLE.read_bytes()).hexdigest()
        assert host not in out.stdout


# --- the locks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("image", ["hub", "notebook", "trial"])
def test_lock_satisfies_what_the_image_installs_tunehub_with(image: str) -> None:
    """The build's ``pip check`` sees tunehub's base requirements but not its extras: a
    dependency added to an extra in pyproject.toml without re-running images/lock.py would be
    missing from the image unnoticed. This checks every requirement of the extras the image's
    requirements.in names against the lock (no network)."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    folder = REPO / "images" / image
    source = (folder / "requirements.in").read_text().splitlines()
    lines = [ln.split("#")[0].strip() for ln in source]
    project = next(ln for ln in lines if ln.startswith("."))
    extras = Requirement("tunehub" + project[1:]).extras
    pins = {}
    for line in (folder / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*meta["dependencies"], *(d for e in extras for d in meta["optional-dependencies"][e])]
    env = {"python_version": "3.11", "platform_machine": "x86_64", "sys_platform": "linux"}
    missing = []
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        version = pins.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (lock: {version})")
    assert not missing, f"images/{image}/requirements.txt is stale, run images/lock.py: {missing}"


# --- hub ----------------------------------------------------------------------------------------

HUB_PROBE = r"""
import json
import hub, kubespawner, tuner
from traitlets.config.loader import PyFileConfigLoader
c = PyFileConfigLoader("jupyterhub_config.py", path="/srv/tunehub").load_config()
ks = c.TunehubKubeSpawner
print(json.dumps({
    "modules": [m.__file__ for m in (hub, tuner, kubespawner)],
    "spawner": [k.__module__ + "." + k.__name__ for k in c.JupyterHub.spawner_class.__mro__],
    "image": ks.image,
    "namespace": ks.namespace,
    "services": sorted(s["name"] for s in c.JupyterHub.services),
    "proxy_starts": c.ConfigurableHTTPProxy.should_start,
}))
"""


def hub_pod(tmp_path: Path) -> tuple[dict[str, str], dict[Path, str], dict[str, Any]]:
    """The env and volumes of the hub container the chart renders (Secrets and the downward
    API filled in as Kubernetes would; the values Secret written where it is mounted), and the
    container itself."""
    objects = render(minimal_values())
    deployment = find(objects, "Deployment", "tunehub-hub")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # What the Secrets the chart refers to would hold (the config only reads them here).
    secrets = {"TUNEHUB_DB_URL": "postgresql+psycopg://tunehub@tunehub-db:5432/tunehub"}
    env = {}
    for e in container["env"]:
        source = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.namespace", e
            env[e["name"]] = NAMESPACE
        else:
            env[e["name"]] = secrets.get(e["name"], "s" * 32)
    volumes: dict[Path, str] = {}
    for mount in container["volumeMounts"]:
        host = tmp_path / mount["name"]
        host.mkdir()
        if mount["name"] == "values":
            (host / "values.yaml").write_text(yaml.safe_dump(hub_values(objects)))
        else:
            os.chown(host, 1000, 100)  # the pod's fsGroup makes its volumes writable
        volumes[host] = mount["mountPath"] + (":ro" if mount.get("readOnly") else "")
    return env, volumes, container


def test_hub_image_loads_the_charts_config_in_kubernetes_mode(images: Images,
                                                              tmp_path: Path) -> None:
    check_pod_shape(images, "hub")
    env, volumes, container = hub_pod(tmp_path)
    assert container["args"][0] == "jupyterhub"  # the chart keeps the image's entrypoint (tini)
    probe = images.run("hub", ["python", "-c", HUB_PROBE], env=env, volumes=volumes)
    assert probe.returncode == 0, probe.stderr[-3000:]
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    # The installed packages, not the repository, are imported.
    assert all("/site-packages/" in path for path in got["modules"]), got["modules"]
    assert got["spawner"][:1] == ["hub.kube_spawner.TunehubKubeSpawner"]
    assert "kubespawner.spawner.KubeSpawner" in got["spawner"]
    nb = yaml.safe_load((REPO / "helm/tunehub/values.yaml").read_text())["images"]["notebook"]
    assert got["image"] == f"{nb['repository']}:{nb['tag']}"
    assert got["namespace"] == NAMESPACE
    assert "tuner" in got["services"] and got["proxy_starts"] is False

    helped = images.run("hub", [*container["args"], "--help-all"], env=env, volumes=volumes)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "--JupyterHub.spawner_class" in helped.stdout


# --- notebook -----------------------------------------------------------------------------------

@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_notebook_image_serves_jupyterhub_singleuser(images: Images, tuner_hub: TunerHub) -> None:
    check_pod_shape(images, "notebook")
    user = "alice"
    server_token = tuner_hub.token(user, ["users:activity!user=alice", "access:servers!user=alice"])
    user_token = tuner_hub.token(user, ["access:servers!user=alice"])
    port = free_port()
    prefix = f"/user/{user}/"
    env = {  # what JupyterHub's Spawner gives a server
        "JUPYTERHUB_API_URL": f"{tuner_hub.url}hub/api",
        "JUPYTERHUB_API_TOKEN": server_token,
        "JUPYTERHUB_USER": user,
        "JUPYTERHUB_SERVER_NAME": "",
        "JUPYTERHUB_CLIENT_ID": f"jupyterhub-user-{user}",
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": json.dumps(
            [f"access:servers!server={user}/", f"access:servers!user={user}"]),
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}{prefix}",
    }
    with images.container("notebook") as ctr:
        argv = images.run_argv(ctr, "notebook", ["jupyterhub-singleuser"], env=env)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(argv, env=images.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)

        proc, tries = start(), 1
        base = f"http://127.0.0.1:{port}{prefix}api"
        auth = {"Authorization": f"token {user_token}"}
        try:
            def answers() -> bool:
                nonlocal proc, tries
                if proc.poll() is not None:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    if failed_transiently(proc.returncode, out) and tries < BUILDAH_TRIES:
                        proc, tries = start(), tries + 1
                        return False
                    raise AssertionError(f"jupyterhub-singleuser exited:\n{out[-3000:]}")
                try:
                    return httpx.get(f"{base}/status", headers=auth, timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(answers, timeout=180, what="jupyterhub-singleuser in the notebook image")
            status = httpx.get(f"{base}/status", headers=auth, timeout=10).json()
            assert "kernels" in status and "started" in status
            specs = httpx.get(f"{base}/kernelspecs", headers=auth, timeout=10).json()
            assert "python3" in specs["kernelspecs"]
            # The hub, not the server, decides: no token, or another user's, is refused.
            assert httpx.get(f"{base}/status", timeout=10).status_code == 403
            other = tuner_hub.token("bob", ["access:servers!user=bob"])
            refused = httpx.get(f"{base}/status", timeout=10,
                                headers={"Authorization": f"token {other}"})
            assert refused.status_code == 403
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# --- trial --------------------------------------------------------------------------------------

TRAIN = """
import os, sys
import tensorflow as tf
from sklearn.datasets import load_digits
import tuner

print("in-image uid", os.getuid(), "python", sys.executable, "tf", tf.__version__, flush=True)
p = tuner.params({"units": 32})
x, y = load_digits(return_X_y=True)
x = x / 16.0
model = tf.keras.Sequential([
    tf.keras.Input((64,)),
    tf.keras.layers.Dense(p["units"], activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
model.compile(tf.keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy",
              metrics=["accuracy"])
history = model.fit(x[:1400], y[:1400], validation_data=(x[1400:], y[1400:]), epochs=3,
                    verbose=0)
for step, value in enumerate(history.history["val_accuracy"], 1):
    tuner.report(value, step=step)
tuner.save_model(model)
"""

# The spec's command: runs the trial in a fresh container of the trial image, as the Kubernetes
# backend runs it in a pod: the trial SDK's variables only, the tuner reached over the network.
IN_IMAGE = """
import os, subprocess, sys

image, entrypoint = os.environ["TRIAL_IMAGE"], os.environ["TRIAL_ENTRYPOINT"].split()
home = os.environ["SWEEPS_HOME"]  # the workdir links into the sweep's code snapshot there
for path in (os.getcwd(), os.environ["TUNEHUB_ARTIFACT_DIR"]):
    os.chown(path, 1000, 100)  # what the pod's fsGroup does for its volume
sdk = ("TUNEHUB_PARAMS", "TUNEHUB_API_URL", "TUNEHUB_TRIAL_ID", "TUNEHUB_TRIAL_ATTEMPT",
       "TUNEHUB_TRIAL_TOKEN", "TUNEHUB_ARTIFACT_DIR")
ctr = subprocess.run(["buildah", "from", image], check=True, capture_output=True,
                     text=True).stdout.strip()
try:
    argv = ["buildah", "run", "--isolation", "chroot", "--network", "host",
            "--volume", f"{home}:{home}", "--workingdir", os.getcwd()]
    for key in sdk:
        if key in os.environ:
            argv += ["--env", f"{key}={os.environ[key]}"]
    # Again after buildah's transient failure (see BUILDAH_TRANSIENT in the test), which comes
    # before the container's command starts; its error output is passed on after each try.
    for _ in range(int(os.environ["BUILDAH_TRIES"])):
        run = subprocess.run([*argv, ctr, "--", *entrypoint, "python3", *sys.argv[1:]],
                             stderr=subprocess.PIPE, text=True)
        sys.stderr.write(run.stderr)
        if run.returncode == 0 or os.environ["BUILDAH_TRANSIENT"] not in run.stderr:
            break
    code = run.returncode
finally:
    subprocess.run(["buildah", "rm", ctr], capture_output=True)
sys.exit(code)
"""


def test_trial_image_runs_trials_that_report_to_the_tuner(images: Images, sqlite_home: Home,
                                                          tmp_path: Path) -> None:
    check_pod_shape(images, "trial")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(TRAIN))
    (code / "in_image.py").write_text(textwrap.dedent(IN_IMAGE))
    spec = {
        "name": "in-image", "command": "python -u in_image.py train.py",
        "metric": "val_accuracy", "direction": "maximize", "trials": 2, "parallelism": 1,
        "sampler": "random", "pruner": "none",
        "space": {"units": {"type": "int", "low": 16, "high": 64}},
        "promote": {"model": "digits-image", "policy": "always"},
        # Trials see none of the platform's TUNEHUB_* variables: tunehub's home (where the code
        # snapshot lies) is handed to the container runner under a name of its own.
        "env": {"SWEEPS_HOME": str(sqlite_home.path), "BUILDAH_TRIES": str(BUILDAH_TRIES),
                "BUILDAH_TRANSIENT": BUILDAH_TRANSIENT},
    }
    (code / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sqlite_home.extra_env.update({
        "CONTAINERS_STORAGE_CONF": images.env["CONTAINERS_STORAGE_CONF"],
        "TRIAL_IMAGE": images.name("trial"),
        "TRIAL_ENTRYPOINT": " ".join(images.config("trial")["Entrypoint"]),
    })
    ran = sqlite_home.cli("sweep", "run", str(code / "sweep.yaml"), "--wait", "--json",
                          timeout=1200)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    sweep = json.loads(ran.stdout)
    shown = json.loads(sqlite_home.cli("sweep", "show", str(sweep["id"]), "--json",
                                       check=True).stdout)
    logs = sqlite_home.cli("sweep", "logs", str(sweep["id"]), "0", check=True).stdout
    assert sweep["state"] == "completed", logs[-3000:]
    trials = shown["trials_detail"]
    assert [t["state"] for t in trials] == ["completed", "completed"], logs[-3000:]
    for trial in trials:
        # Three epochs, each reported by the trial in the image, the last one its result.
        steps = trial["intermediate_values"]
        assert [s["step"] for s in steps] == [1, 2, 3]
        # Really trained (chance is 0.1): 3 epochs of this model reach ~0.9 on digits.
        assert trial["value"] == steps[-1]["value"] and 0.5 < trial["value"] <= 1.0
    # It ran in the image: as uid 1000, with the image's own Python and TensorFlow.
    assert "in-image uid 1000 python /usr/bin/python3 tf 2.21.0" in logs
    # The best trial's SavedModel, written in the container, became the registered version.
    versions = json.loads(sqlite_home.cli("model", "show", "digits-image", "--json",
                                          check=True).stdout)
    assert len(versions) == 1 and versions[0]["stage"] == "production"
    best = max(trials, key=lambda t: t["value"])
    assert versions[0]["trial_number"] == best["number"]
    assert versions[0]["metric_value"] == best["value"]
    assert (Path(versions[0]["path"]) / "saved_model.pb").exists()

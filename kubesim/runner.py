"""Runs one pod's containers as local processes: the kubelet stand-in's container runtime.

Each container's ``command`` + ``args`` run with the pod's environment (plain values,
``$(VAR)`` expansion, secretKeyRef / configMapKeyRef / fieldRef / resourceFieldRef, envFrom)
and ``workingDir``. Images are ignored; ``python`` resolves to the test venv's interpreter.
Volumes: see :mod:`kubesim.volumes` (a PersistentVolumeClaim is visible only at the local
directory the test mapped it to; anything else fails the pod with reason FailedMount).
Output goes to ``<log_dir>/<namespace>/<pod>/<container>.log`` for ``pods/log``."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .admission import now
from .client import ApiFailure, HarnessClient, path_of
from .objects import JSON
from .podnet import HOSTS_ENV, SITE_DIR, PodNetwork
from .validation import parse_quantity
from .volumes import Mounter, PodConfigError

#: Longest we wait between SIGTERM and SIGKILL, whatever terminationGracePeriodSeconds says.
GRACE_CAP = 3.0
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(value: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


@dataclass
class Runtime:
    """What the container runtime stand-in knows about the host, shared by all pods.

    ``claims`` maps PVC names to local directories; images in ``missing_images`` fail to pull
    (ErrImagePull, then ImagePullBackOff, pod stays Pending); with ``enforce_memory_limits``
    a container whose process tree's RSS exceeds its memory limit is SIGKILLed and reported
    as OOMKilled (exit code 137), like the kernel's cgroup OOM killer. With ``run_as_users``
    (the harness running as root) a container's process runs as its ``runAsUser`` /
    ``runAsGroup`` (the container's, else the pod's) with the pod's ``fsGroup`` as a
    supplementary group, so file permissions hold between pods and the host as on a node.
    A container granted ``nvidia.com/gpu`` gets what NVIDIA's device plugin and container
    toolkit give it on a GPU node: ``NVIDIA_VISIBLE_DEVICES`` naming its devices, and the
    driver's libraries, here ``gpu_driver_env`` (e.g. an NVML stand-in on ``LD_LIBRARY_PATH``)."""

    claims: dict[str, Path]
    log_dir: Path
    api_port: int
    missing_images: set[str] = field(default_factory=set)
    enforce_memory_limits: bool = True
    run_as_users: bool = False
    network: PodNetwork | None = None  # pod addresses and names (default: beside the logs)
    gpu_driver_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.network is None:
            self.network = PodNetwork(self.log_dir / "pod-hosts.json")


def _tree_rss(pid: int) -> int:
    """Resident memory in bytes of ``pid`` and its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


class PodRunner:
    """Owns the processes of one pod and reports its status through the API."""

    def __init__(self, client: HarnessClient, pod: JSON, runtime: Runtime) -> None:
        self.client, self.pod, self.runtime = client, pod, runtime
        self.claims = runtime.claims
        self.name, self.namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        self.log_dir = runtime.log_dir / self.namespace / self.name
        self.api_port = runtime.api_port
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.deleted = False
        self.status: JSON = dict(pod.get("status") or {})
        self.mounter = Mounter(pod, runtime.claims, self._ref, self._field)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"kubelet-{self.name}-"))
        self.task: asyncio.Task[None] | None = None
        self.ip = "127.0.0.1"  # its own loopback address once it runs (kubesim.podnet)

    # -- environment -------------------------------------------------------------------------
    async def _ref(self, kind: str, ref: JSON) -> JSON | str | None:
        plural = "secrets" if kind == "secret" else "configmaps"
        try:
            obj = await self.client.request(
                "GET", f"/api/v1/namespaces/{self.namespace}/{plural}/{ref['name']}")
        except ApiFailure as exc:
            if exc.status == 404:
                if ref.get("optional"):
                    return None
                raise PodConfigError("CreateContainerConfigError",
                                     f'{kind} "{ref["name"]}" not found', retry=True) from None
            raise
        if ref.get("key") is None:
            return obj
        data = obj.get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise PodConfigError("CreateContainerConfigError",
                                 f"couldn't find key {ref['key']} in {kind} "
                                 f"{self.namespace}/{ref['name']}", retry=True)
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if kind == "secret" else value

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        m = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
        if m:
            return (meta.get(m.group(1)) or {}).get(m.group(2), "")
        values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
                  "spec.serviceAccountName": spec.get("serviceAccountName", ""),
                  "status.podIP": self.ip, "status.hostIP": "127.0.0.1",
                  "status.podIPs": self.ip, "status.hostIPs": "127.0.0.1"}
        if path not in values:
            raise PodConfigError("CreateContainerConfigError", f"unsupported fieldRef {path}")
        return values[path]

    async def environment(self, container: JSON) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(self._scratch), "LANG": "C.UTF-8",
               "HOSTNAME": self.pod["spec"].get("hostname") or self.name,
               "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(self.api_port)}
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            for kind, key in (("secret", "secretRef"), ("configmap", "configMapRef")):
                if key in src:
                    obj = cast("JSON | None",  # no key: _ref gives the whole object
                               await self._ref(kind, {**src[key], "key": None}))
                    for k, v in ((obj or {}).get("data") or {}).items():
                        env[prefix + k] = base64.b64decode(v).decode() if kind == "secret" \
                            else v
        for var in container.get("env") or []:
            name, source = var["name"], var.get("valueFrom")
            if source is None:
                env[name] = _expand(var.get("value", ""), env)
                continue
            value: str | None
            if "secretKeyRef" in source:
                value = cast("str | None", await self._ref("secret", source["secretKeyRef"]))
            elif "configMapKeyRef" in source:
                value = cast("str | None",
                             await self._ref("configmap", source["configMapKeyRef"]))
            elif "fieldRef" in source:
                value = self._field(source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                kind, _, res = source["resourceFieldRef"]["resource"].partition(".")
                resources = (container.get("resources") or {}).get(kind) or {}
                value = str(resources.get(res, "0"))
            else:
                raise PodConfigError("CreateContainerConfigError",
                                     f"env {name}: unsupported valueFrom {sorted(source)}")
            if value is not None:
                env[name] = value
        gpus = int(parse_quantity(str(((container.get("resources") or {}).get("limits") or {})
                                      .get("nvidia.com/gpu", 0))))
        if gpus > 0:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(f"GPU-{i}" for i in range(gpus))
            env.update(self.runtime.gpu_driver_env)
        # The pod network's name resolution for TF_CONFIG (kubesim.podnet).
        # (Runtime.__post_init__ always sets network: None there means "the default one")
        env[HOSTS_ENV] = str(cast(PodNetwork, self.runtime.network).table)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
        return env

    def check_image(self, container: JSON) -> None:
        image = container.get("image", "")
        if image in self.runtime.missing_images:
            pulls = getattr(self, "_pulls", 0)
            self._pulls = pulls + 1
            if pulls == 0:
                raise PodConfigError("ErrImagePull", f'Failed to pull image "{image}": rpc '
                                     "error: code = NotFound desc = failed to pull and unpack "
                                     f'image "{image}": not found', retry=True)
            raise PodConfigError("ImagePullBackOff", f'Back-off pulling image "{image}"',
                                 retry=True)

    async def _watch_memory(self, proc: asyncio.subprocess.Process, limit: int) -> bool:
        """Kill the container's process group once its resident memory exceeds ``limit``."""
        while proc.returncode is None:
            if _tree_rss(proc.pid) > limit:
                _signal(proc, signal.SIGKILL)
                return True
            await asyncio.sleep(0.1)  # sampling interval of the OOM stand-in
        return False

    # -- volumes -------------------------------------------------------------------------------
    # -- lifecycle -----------------------------------------------------------------------------
    async def report(self) -> None:
        if not self.deleted:
            await self.client.replace_status(path_of(self.pod), self.status)

    def _container_status(self, c: JSON, state: JSON, restarts: int = 0,
                          last: JSON | None = None) -> JSON:
        running = "running" in state
        return {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                "containerID": f"harness://{self.name}/{c['name']}", "ready": running,
                "started": running, "restartCount": restarts, "state": state,
                "lastState": last or {}}

    def _conditions(self, ready: bool, reason: str | None = None) -> list[JSON]:
        conds = [c for c in self.status.get("conditions", []) if c["type"] == "PodScheduled"]
        for t in ("Initialized", "ContainersReady", "Ready"):
            cond = {"type": t, "status": "True" if ready or t == "Initialized" else "False",
                    "lastProbeTime": None, "lastTransitionTime": now()}
            if reason and t != "Initialized":
                cond["reason"] = reason
            conds.append(cond)
        return conds

    async def fail(self, err: PodConfigError) -> None:
        waiting = {"waiting": {"reason": err.reason, "message": err.message}}
        self.status["containerStatuses"] = [self._container_status(c, waiting)
                                            for c in self.pod["spec"]["containers"]]
        self.status["message"], self.status["reason"] = err.message, err.reason
        if not err.retry:
            self.status["phase"] = "Failed"
        await self.report()

    async def run(self) -> None:
        containers = self.pod["spec"]["containers"]
        envs: dict[str, dict[str, str]] = {}
        self.ip = cast(PodNetwork, self.runtime.network).attach(self.pod)["ip"]
        while True:
            try:
                for c in (self.pod["spec"].get("initContainers") or []) + containers:
                    self.check_image(c)
                    await self.mounter.mount(c)
                    envs[c["name"]] = await self.environment(c)
                break
            except PodConfigError as err:
                await self.fail(err)
                if not err.retry:
                    return
                await asyncio.sleep(1.0)  # the kubelet retries config errors periodically
        for key in ("message", "reason", "containerStatuses"):
            self.status.pop(key, None)
        self.status.update({"hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                            "podIP": self.ip, "podIPs": [{"ip": self.ip}],
                            "startTime": now()})
        for c in self.pod["spec"].get("initContainers") or []:
            code = await self._run_once(c, envs[c["name"]])
            if code != 0:
                await self._finish({c["name"]: code}, containers)
                return
        results = await asyncio.gather(*(self._supervise(c, envs[c["name"]])
                                         for c in containers))
        await self._finish(dict(results), containers)

    async def _start(self, c: JSON, env: dict[str, str]) -> asyncio.subprocess.Process | str:
        # Without a command the image's entrypoint would run the args (tini -- args, as in
        # Jupyter images): run the args. Nothing at all: the image's CMD is unknowable here.
        argv = [_expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            return ("the kube harness runs a container's command/args as a local process and "
                    "needs spec.containers[].command or args (images are not run)")
        exe = shutil.which(argv[0], path=env["PATH"]) if "/" not in argv[0] else argv[0]
        if exe is None:
            return f'exec: "{argv[0]}": executable file not found in $PATH'
        cwd = Path(c.get("workingDir") or self._scratch)
        cwd.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{c['name']}.log", "ab") as out:
            return await asyncio.create_subprocess_exec(
                exe, *argv[1:], env=env, cwd=str(cwd), stdout=out, stderr=out,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, **self._identity(c))

    def _identity(self, c: JSON) -> dict[str, Any]:
        """``user``/``group``/``extra_groups`` of the container's process (see
        :class:`Runtime`): nothing unless ``run_as_users`` and the harness is root."""
        if not self.runtime.run_as_users or os.geteuid() != 0:
            return {}
        pod_sc = self.pod["spec"].get("securityContext") or {}
        sc = {**pod_sc, **(c.get("securityContext") or {})}
        out: dict[str, Any] = {}
        if sc.get("runAsUser") is not None:
            out["user"] = int(sc["runAsUser"])
        if sc.get("runAsGroup") is not None:
            out["group"] = int(sc["runAsGroup"])
        if pod_sc.get("fsGroup") is not None:
            out["extra_groups"] = [int(pod_sc["fsGroup"])]
        return out

    async def _run_once(self, c: JSON, env: dict[str, str]) -> int:
        proc = await self._start(c, env)
        if isinstance(proc, str):
            self.status["message"] = proc
            return 128
        self.procs[c["name"]] = proc
        return await proc.wait()

    async def _supervise(self, c: JSON, env: dict[str, str]) -> tuple[str, int]:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        restarts, last = 0, None
        while True:
            started = now()
            proc = await self._start(c, env)
            if isinstance(proc, str):
                term = {"exitCode": 128, "reason": "StartError", "message": proc}
                code = 128
            else:
                self.procs[c["name"]] = proc
                self._set_container(c, {"running": {"startedAt": started}}, restarts, last)
                if all(n in self.procs for n in
                       (x["name"] for x in self.pod["spec"]["containers"])):
                    self.status["phase"] = "Running"
                    self.status["conditions"] = self._conditions(True)
                await self.report()
                limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
                monitor = asyncio.create_task(self._watch_memory(
                    proc, int(parse_quantity(limit)))) if (
                    limit and self.runtime.enforce_memory_limits) else None
                code = await proc.wait()
                oom = False
                if monitor is not None:
                    oom = monitor.result() if monitor.done() else False
                    monitor.cancel()
                if code < 0:  # killed by a signal: report as a shell would
                    code = 128 - code
                reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
                term = {"exitCode": code, "reason": reason}
            term.update({"startedAt": started, "finishedAt": now(),
                         "containerID": f"harness://{self.name}/{c['name']}"})
            self._set_container(c, {"terminated": term}, restarts, last)
            if self.deleted or policy == "Never" or (policy == "OnFailure" and code == 0):
                return c["name"], code
            restarts, last = restarts + 1, {"terminated": term}
            self._set_container(c, {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off restarting failed container {c['name']}"}}, restarts, last)
            await self.report()
            await asyncio.sleep(min(0.5 * 2 ** restarts, 5.0))  # CrashLoopBackOff

    def _set_container(self, c: JSON, state: JSON, restarts: int, last: JSON | None) -> None:
        statuses = [s for s in self.status.get("containerStatuses", [])
                    if s["name"] != c["name"]]
        statuses.append(self._container_status(c, state, restarts, last))
        names = [x["name"] for x in self.pod["spec"]["containers"]]
        self.status["containerStatuses"] = sorted(statuses, key=lambda s: names.index(s["name"])
                                                  if s["name"] in names else -1)

    async def _finish(self, codes: dict[str, int], containers: list[JSON]) -> None:
        ok = all(code == 0 for code in codes.values())
        self.status["phase"] = "Succeeded" if ok else "Failed"
        self.status["conditions"] = self._conditions(False, "PodCompleted" if ok else "PodFailed")
        await self.report()
        self.cleanup()

    async def kill(self, grace: float) -> None:
        """Pod deleted: SIGTERM every process group, SIGKILL after the (capped) grace period."""
        self.deleted = True
        procs = [p for p in self.procs.values() if p.returncode is None]
        for p in procs:
            _signal(p, signal.SIGTERM)
        if procs:
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)),
                                       min(grace, GRACE_CAP))
            except asyncio.TimeoutError:
                for p in procs:
                    _signal(p, signal.SIGKILL)
                await asyncio.gather(*(p.wait() for p in procs))
        if self.task and not self.task.done():
            self.task.cancel()
        self.cleanup()

    def cleanup(self) -> None:
        self.mounter.cleanup()
        shutil.rmtree(self._scratch, ignore_errors=True)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

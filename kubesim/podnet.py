"""The emulated pod network: an address per pod and the headless Services' per-pod names.

Real pods have their own network namespace; here every pod's processes share the host's. So
each pod gets a loopback address of its own (``127.0.x.y``, its ``status.podIP``) and each of
its declared container ports a host port: TensorFlow's gRPC server (like most servers)
binds its port on every interface, so two "pods" can only both listen on 2222 if the port is
remapped, the way a container runtime publishes ports.

Names: a pod with ``hostname`` and ``subdomain`` (an Indexed Job's pods behind the headless
Service tunehub creates) answers to ``<hostname>.<subdomain>[.<namespace>[.svc[.cluster.local]]]``.
The table (name -> address and port map) is a JSON file the kubelet rewrites atomically; the
only consumer is :mod:`kubesim.podnet_site.sitecustomize`, which every pod's Python process
loads (the kubelet puts it on ``PYTHONPATH``) and which rewrites ``TF_CONFIG``'s
``name:port`` entries to ``address:host-port`` before the trial's code runs. Trial code and
tunehub's manifests stay exactly as on a real cluster; only ``TF_CONFIG`` is resolved (the
emulator has no DNS server for other clients).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tunehub_base.ports import unclaimed_port

from .objects import JSON

#: Environment variable naming the table for :mod:`kubesim.podnet_site.sitecustomize`.
HOSTS_ENV = "KUBE_HARNESS_POD_HOSTS"
SITE_DIR = Path(__file__).resolve().parent / "podnet_site"


class PodNetwork:
    """Hands out pod addresses and ports, and keeps the name table current."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self._count = 0
        self._pods: dict[str, JSON] = {}  # pod uid -> {"ip", "ports", "names"}

    def attach(self, pod: JSON) -> JSON:
        """The pod's address and port map (allocated once per pod uid)."""
        uid = pod["metadata"]["uid"]
        if uid in self._pods:
            return self._pods[uid]
        self._count += 1
        n = self._count
        ip = f"127.0.{n // 250 % 250}.{n % 250 + 2}"  # never 127.0.0.1 (the host's)
        # Pods share the host's ports: each its own, none another pod's (maybe not bound yet).
        taken = {port for other in self._pods.values() for port in other["ports"].values()}
        ports: dict[str, int] = {}
        for name in [str(p["containerPort"])
                     for c in pod["spec"]["containers"] for p in c.get("ports") or []]:
            port = unclaimed_port()
            while port in taken:
                port = unclaimed_port()
            taken.add(port)
            ports[name] = port
        names = []
        spec, ns = pod["spec"], pod["metadata"]["namespace"]
        if spec.get("hostname") and spec.get("subdomain"):
            base = f"{spec['hostname']}.{spec['subdomain']}"
            names = [base, f"{base}.{ns}", f"{base}.{ns}.svc", f"{base}.{ns}.svc.cluster.local"]
        self._pods[uid] = {"ip": ip, "ports": ports, "names": names}
        self._write()
        return self._pods[uid]

    def detach(self, uid: str) -> None:
        if self._pods.pop(uid, None) is not None:
            self._write()

    def _write(self) -> None:
        hosts = {name: {"ip": p["ip"], "ports": p["ports"]}
                 for p in self._pods.values() for name in p["names"]}
        self.table.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.table.parent, prefix=".pod-hosts.")
        with os.fdopen(fd, "w") as fh:
            json.dump(hosts, fh)
        os.replace(tmp, self.table)

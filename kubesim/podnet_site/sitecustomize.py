"""Loaded by every Python process of an emulated pod (the kubelet stand-in puts this directory
on PYTHONPATH): resolves ``TF_CONFIG``'s pod names through the emulator's pod network table
(see :mod:`kubesim.podnet`), as cluster DNS and the pod network would on a real cluster.

A name that is not in the table yet (its pod has not started) is waited for, as TensorFlow
waits for a peer that does not answer yet; after the deadline it is left as it is.
"""

import json
import os
import time
from typing import Any


def _resolve_tf_config() -> None:
    raw, table = os.environ.get("TF_CONFIG"), os.environ.get("KUBE_HARNESS_POD_HOSTS")
    if not raw or not table:
        return
    try:
        config = json.loads(raw)
        cluster = config["cluster"]
    except (ValueError, KeyError, TypeError):
        return
    wanted = {h.rpartition(":")[0] for hosts in cluster.values() for h in hosts}
    deadline = time.monotonic() + float(os.environ.get("KUBE_HARNESS_DNS_WAIT", "120"))
    hosts: dict[str, Any] = {}
    while True:
        try:
            with open(table) as fh:
                hosts = json.load(fh)
        except (OSError, ValueError):
            hosts = {}
        if wanted <= set(hosts) or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the peer's pod has not started: poll the table like a DNS retry

    def resolve(entry: str) -> str:
        name, _, port = entry.rpartition(":")
        found = hosts.get(name)
        if found is None:
            return entry
        return f"{found['ip']}:{found['ports'].get(port, port)}"

    config["cluster"] = {role: [resolve(h) for h in hs] for role, hs in cluster.items()}
    os.environ["TF_CONFIG"] = json.dumps(config)


_resolve_tf_config()

"""``python -m kubesim --data DIR``: run the emulated cluster standalone until interrupted.

Prints one JSON line with the API URL, kubeconfig path, namespace, the admin bearer token and
the counters URL, so a
benchmark (or a person with kubectl) can use it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from .cluster import KubeCluster
from .rbac import ADMIN_TOKEN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=__doc__)
    parser.add_argument("--data", type=Path, required=True,
                        help="local directory backing the tunehub-data claim")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the kubeconfig and pod logs go (default: a temp dir)")
    parser.add_argument("--namespace", default="tunehub")
    args = parser.parse_args(argv)
    cluster = KubeCluster(args.workdir, namespace=args.namespace, data_dir=args.data)
    cluster.start()
    print(json.dumps({"url": cluster.url, "kubeconfig": str(cluster.kubeconfig),
                      "namespace": cluster.namespace, "data": str(cluster.data_dir),
                      "token": ADMIN_TOKEN,
                      "counters": f"{cluster.url}/_emulator/counters"}), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

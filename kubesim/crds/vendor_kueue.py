"""Regenerate ``kueue-v1beta2.json``: the ``v1beta2`` OpenAPI schemas of the Kueue CRDs the
emulator serves, taken from Kueue's published CRDs (``config/components/crd/bases`` of
kubernetes-sigs/kueue), descriptions dropped to keep the file small.

    python kubesim/crds/vendor_kueue.py /path/to/kueue-checkout [commit]

Why vendored: no cluster (and no network) in the tests; the emulator validates Kueue objects
against exactly what a current Kueue's API server would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
KINDS = ("clusterqueues", "localqueues", "resourceflavors", "workloads",
         "workloadpriorityclasses")
VERSION = "v1beta2"


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def main(checkout: str, commit: str = "") -> None:
    out: dict[str, Any] = {"source": "kubernetes-sigs/kueue config/components/crd/bases",
                           "commit": commit, "version": VERSION, "schemas": {}}
    for plural in KINDS:
        crd = yaml.safe_load((Path(checkout) / "config/components/crd/bases" /
                              f"kueue.x-k8s.io_{plural}.yaml").read_text())
        version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
        out["schemas"][crd["spec"]["names"]["kind"]] = _strip(
            version["schema"]["openAPIV3Schema"])
    (HERE / "kueue-v1beta2.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""How a Kubernetes cluster names its GPUs: the one statement of these names in Python.

Three names: the extended resource pods request (``nvidia.com/gpu``, the NVIDIA device plugin),
the node label naming a node's GPU model (``nvidia.com/gpu.product``, GPU feature discovery)
and the key of the taint on GPU nodes (``nvidia.com/gpu``, tolerated with ``NoSchedule``).

The Helm chart cannot import Python, so the design is: the chart's ``gpuNames`` value is what
every manifest uses (Kueue flavors and quotas, serving), and the chart hands the same value to
the hub (its values file, read by :func:`GpuNames.from_values` in :mod:`hub.kube`) and to the
tuner (``TUNEHUB_K8S_GPU_*``, read by :func:`GpuNames.from_env` for trial Jobs). The defaults
below are only for the tuner outside the chart and the hub with values from before the key;
``tests/test_gpu_names.py`` fails when they differ from ``values.yaml``'s defaults.

A light module (no Kubernetes client): the hub and the tuner's backend both import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: Field -> the chart's key under ``gpuNames`` and the tuner's environment variable.
VALUES_KEYS = {"resource": "resource", "product_label": "productLabel", "taint_key": "taintKey"}
ENV_VARS = {"resource": "TUNEHUB_K8S_GPU_RESOURCE",
            "product_label": "TUNEHUB_K8S_GPU_PRODUCT_LABEL",
            "taint_key": "TUNEHUB_K8S_GPU_TAINT_KEY"}


@dataclass(frozen=True)
class GpuNames:
    """The GPU resource, product label and taint key of a cluster."""

    resource: str = "nvidia.com/gpu"
    product_label: str = "nvidia.com/gpu.product"
    taint_key: str = "nvidia.com/gpu"

    def toleration(self) -> dict[str, str]:
        """What GPU pods carry: GPU nodes are tainted so CPU work stays off them."""
        return {"key": self.taint_key, "operator": "Exists", "effect": "NoSchedule"}

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> GpuNames:
        """From the chart's values (``gpuNames``); a name not given keeps its default."""
        given = values.get("gpuNames") or {}
        return cls(**{f.name: str(given[VALUES_KEYS[f.name]]) for f in fields(cls)
                      if given.get(VALUES_KEYS[f.name])})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GpuNames:
        """From ``TUNEHUB_K8S_GPU_RESOURCE``, ``_PRODUCT_LABEL`` and ``_TAINT_KEY``."""
        return cls(**{f.name: env[ENV_VARS[f.name]] for f in fields(cls)
                      if env.get(ENV_VARS[f.name])})

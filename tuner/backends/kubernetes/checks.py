"""Submission checks: refuse a sweep whose trials can never run, before anything is stored.

Too many GPUs for any node (the Nodes' allocatable GPU resource, ``KubeSettings.gpu_names``,
when the tuner may read Nodes, else ``maxPerNode`` from the settings), an unknown GPU type, a
missing PriorityClass, a GPU count above the per-user cap, a home outside the shared data
store, and finally a server-side dry run of a trial Job (schema and admission, nothing stored).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from kubernetes_asyncio.client.exceptions import ApiException

from tunehub_base.settings import load_settings
from tuner.backends._base import TrialLaunch
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.api import ClusterUnavailable, Kube, api_message, connect, describe
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.errors import TunehubError
from tuner.spec import SpecError, SweepSpec


def check_spec(s: KubeSettings, spec: SweepSpec) -> None:
    """Refuse what can never run: too many GPUs for any node, an unknown GPU type, a
    missing PriorityClass, a manifest the API server rejects (dry run: nothing stays)."""
    res = spec.resources
    if spec.priority not in s.priority_classes:
        raise SpecError("priority", f"no PriorityClass configured for {spec.priority!r}")
    home = load_settings().sweeps_dir
    try:
        m.relative_to_data(s, home)
    except ValueError as exc:
        raise SpecError("backend", str(exc)) from None
    want = res.gpu * res.workers
    if s.max_gpus_per_user and want > s.max_gpus_per_user:
        raise SpecError(
            "resources.gpu",
            f"a trial needs {want} GPU(s) but each user may hold at most "
            f"{s.max_gpus_per_user} (TUNEHUB_K8S_MAX_GPUS_PER_USER)",
        )
    # Sync callers (CLI, request handlers): a loop of its own, in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(asyncio.run, _check_cluster(s, spec)).result()
        except TunehubError:
            raise
        except Exception as exc:
            raise ClusterUnavailable(f"checking the sweep: {describe(exc)}") from None

async def _check_cluster(s: KubeSettings, spec: SweepSpec) -> None:
    res = spec.resources
    kube = Kube(await connect(s), s.namespace)
    try:
        try:
            nodes = await kube.node_gpus(s.gpu_names)
        except Exception as exc:
            raise ClusterUnavailable(
                f"cannot reach the Kubernetes API ({describe(exc)})"
            ) from None
        gpu = s.gpu_type(res.gpu_type) if res.gpu_type else None
        if res.gpu_type and gpu is None:
            known: set[str] = {p for p, _ in nodes or [] if p}
            if res.gpu_type not in known:
                offered = ", ".join(g.name for g in s.gpu_types) or ", ".join(sorted(known))
                raise SpecError(
                    "resources.gpu_type",
                    f"unknown GPU type {res.gpu_type!r}; this cluster offers: "
                    f"{offered or 'no GPUs'}",
                )
        product = gpu.product if gpu else res.gpu_type
        if res.gpu:
            if nodes is not None:
                per_node = [n for p, n in nodes if product is None or p == product]
                source = f"allocatable {s.gpu_names.resource} of the cluster's nodes"
            else:
                types = [gpu] if gpu else list(s.gpu_types)
                per_node = [g.max_per_node or 0 for g in types]
                source = "maxPerNode in TUNEHUB_K8S_GPU_TYPES"
            most = max(per_node, default=0)
            if res.gpu > most:
                what = f"{res.gpu_type} " if res.gpu_type else ""
                raise SpecError(
                    "resources.gpu",
                    f"{res.gpu} GPU(s) per worker requested but no {what}node has more "
                    f"than {most} ({source})",
                )
        pclass = s.priority_classes[spec.priority]
        if await kube.priority_class_exists(pclass) is False:
            raise SpecError(
                "priority",
                f"PriorityClass {pclass!r} for priority {spec.priority} does not exist in "
                "the cluster (install the chart's priority classes or set "
                "TUNEHUB_K8S_PRIORITY_CLASSES)",
            )
        await _dry_run(s, kube, spec)
    finally:
        await kube.close()

async def _dry_run(s: KubeSettings, kube: Kube, spec: SweepSpec) -> None:
    """The API server's own validation and admission of a trial Job, stored nowhere."""
    probe = TrialLaunch(
        sweep_id=0, trial_id=0, number=0, attempt=1, command=spec.command,
        workdir=s.data_path / ".tunehub-check", env=dict(spec.env),
        resources=spec.resources, timeout=spec.trial_timeout, log_path=Path(),
        priority=spec.priority,
    )
    try:
        warnings = await kube.dry_run_warnings(m.job(s, probe))
    except ApiException as exc:
        message = api_message(exc)
        raise SpecError("spec", f"the cluster refuses the trial Job: {message}") from None
    # The API server admits a Job whose pods Pod Security will refuse, with a warning: those
    # trials could never start, so refuse now.
    refused = [w for w in warnings if "PodSecurity" in w]
    if refused:
        raise SpecError("spec", f"the cluster would refuse the trial pods: {refused[0]}")

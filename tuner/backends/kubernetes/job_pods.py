"""Reading an attempt's pods after the fact: why they failed, and their output for the trial's
log (from the pods' log API, never from the volume). The watches (:mod:`.watch`) usually tell
the backend both as they happen; these reads are for what the watches missed (a Job that
failed before its pod was seen) and for the log, which is read once, when the attempt ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.backends.kubernetes.api import Kube
from tuner.backends.kubernetes.status import pod_failure
from tuner.backends.kubernetes.workdir import append_log

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


async def job_pods(kube: Kube, job: str, selector: str) -> list[dict[str, Any]]:
    """The pods the Job controller made for ``job`` (``selector``: this release's objects)."""
    listed = await kube.list("pods", f"{selector},{JOB_NAME_LABEL}={job}")
    return list(listed.get("items") or [])


def first_failure(pods: list[dict[str, Any]]) -> str | None:
    """Why the first of ``pods`` that failed failed (OOMKilled, an exit code), or None."""
    return next((reason for reason in map(pod_failure, pods) if reason), None)


async def save_log(kube: Kube, job: str, selector: str, pods: set[str], root: Path,
                   path: Path) -> None:
    """The output of ``pods`` (all of ``job``'s when none are known yet), read through the
    log API and appended to the trial's log at ``path`` under the data root ``root`` without
    following links (:func:`.workdir.append_log`); with several pods (workers) each under a
    header."""
    if not pods:
        pods = {p["metadata"]["name"] for p in await job_pods(kube, job, selector)}
    if not pods or not str(path) or path == Path():
        return
    chunks = []
    for pod in sorted(pods):
        text = await kube.pod_log(pod)
        if text:
            chunks.append(f"--- pod {pod} ---\n{text}" if len(pods) > 1 else text)
    if chunks:
        append_log(root, path, "".join(c if c.endswith("\n") else c + "\n" for c in chunks))

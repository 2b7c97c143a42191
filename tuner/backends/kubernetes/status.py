"""What a Job's or a pod's status means for the attempt, in words for people.

Pure functions over the API's JSON, used by the watches in :mod:`.backend`:

- :func:`job_outcome`: finished (Complete / Failed with the Job controller's reason) or not.
- :func:`pod_problem`: why a pod cannot run. Image pull errors and bad configuration never fix
  themselves, so they end the attempt at once ("fatal"); Unschedulable may clear when other
  work finishes, so it ends the attempt only after ``TUNEHUB_K8S_UNSCHEDULABLE_TIMEOUT``.
- :func:`pod_failure`: why a pod's container ended badly (OOMKilled, exit code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tuner.lifecycle.states import EventKind

#: Waiting reasons after which a container never starts by itself.
FATAL_WAITING = {
    "ErrImagePull": "image pull failed",
    "ImagePullBackOff": "image pull failed",
    "InvalidImageName": "invalid image name",
    "CreateContainerError": "container could not be created",
    "RunContainerError": "container could not be started",
    "FailedMount": "volume could not be mounted",
}


@dataclass(frozen=True)
class Problem:
    kind: Literal["fatal", "unschedulable"]
    reason: str


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def job_started(job: dict[str, Any]) -> bool:
    status = job.get("status") or {}
    return bool(status.get("active") or status.get("ready")) and not (
        job.get("spec") or {}
    ).get("suspend")


def job_outcome(job: dict[str, Any]) -> tuple[EventKind, str] | None:
    """``(SUCCEEDED, "")`` / ``(FAILED, reason)`` once the Job controller decided."""
    conds = _conditions(job)
    if conds.get("Complete", {}).get("status") == "True":
        return EventKind.SUCCEEDED, ""
    failed = conds.get("Failed") or conds.get("FailureTarget")
    if failed and failed.get("status") == "True":
        reason = failed.get("reason") or "Failed"
        if reason == "DeadlineExceeded":
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            return EventKind.FAILED, (
                f"timed out after {deadline}s (trial_timeout, DeadlineExceeded)")
        message = failed.get("message") or ""
        return EventKind.FAILED, f"{reason}: {message}" if message else reason
    return None


def pod_problem(pod: dict[str, Any]) -> Problem | None:
    """A pod that is not running and will not (or not soon) run."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    for cs in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        what = FATAL_WAITING.get(waiting.get("reason", ""))
        if what:
            message = waiting.get("message") or waiting["reason"]
            return Problem("fatal", f"{what} ({waiting['reason']}): {message}")
    scheduled = _conditions(pod).get("PodScheduled")
    if scheduled and scheduled.get("status") == "False" and (
        scheduled.get("reason") == "Unschedulable"
    ):
        return Problem("unschedulable", f"unschedulable: {scheduled.get('message', '')}".strip())
    return None


def pod_failure(pod: dict[str, Any]) -> str | None:
    """Why a Failed pod failed, e.g. ``OOMKilled: ... memory limit 64Mi``; None otherwise."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    if "DisruptionTarget" in _conditions(pod):
        return None  # preempted: the Job replaces the pod (podFailurePolicy Ignore)
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if not term:
            continue
        code = term.get("exitCode")
        if term.get("reason") == "OOMKilled":
            limit = _memory_limit(pod, cs.get("name", ""))
            return f"OOMKilled: exceeded its memory limit{f' ({limit})' if limit else ''}"
        if code not in (None, 0):
            detail = f": {term['message'].strip()}" if term.get("message") else ""
            return f"exited with code {code}{detail}"
    reason = status.get("reason")
    if reason:
        return f"{reason}: {status.get('message', '')}".rstrip(": ")
    return None


def _memory_limit(pod: dict[str, Any], container: str) -> str | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return None

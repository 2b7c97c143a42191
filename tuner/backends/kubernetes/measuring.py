"""Serving cost on Kubernetes: each candidate model measured in a measuring pod.

The tuner's pod holds a ServiceAccount token, so it never runs a model (a SavedModel's graph
is a program that could read the token). Instead, for each candidate (:class:`Candidate`):

1. the tuner copies the trial's model with the registry's own no-follow intake
   (:func:`tuner.serving.intake.copy_model`) into a directory of its own on the data store
   (``<TUNEHUB_HOME>/serving-cost/<job>/model``): what is measured is what would be
   registered, and nothing is written in the registry;
2. it creates a Job of one pod (:mod:`.cost_pod`: the trial image's measuring code, non-root,
   no token, that copy mounted read-only, no network, a deadline) and the pod measures the
   model by itself (:mod:`tuner.serving.cost_report`, the same measurement as on one machine);
3. the backend's Job watch (:mod:`.watch`) tells it when the Job ends; its pod's one result
   line is read through the pods' log API, size-capped, parsed strictly;
4. the Job is deleted (its pod and NetworkPolicy follow) and the copy removed, whatever
   happened. A pod that failed, ran past its deadline or was evicted, or a Job that
   vanished, is :class:`CostError` with the reason, which the sweep shows as "serving cost not
   measured: ..." and which keeps the candidate from being promoted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
from typing import TYPE_CHECKING, Any

from tuner.backends.kubernetes import cost_pod
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.api import describe
from tuner.backends.kubernetes.job_pods import JOB_NAME_LABEL, job_pods
from tuner.backends.kubernetes.status import job_outcome, pod_failure, pod_problem
from tuner.lifecycle.states import EventKind
from tuner.serving.cost import CostError
from tuner.serving.cost_report import LOG_BYTES, parse_report
from tuner.serving.measuring import Candidate, Measurer

if TYPE_CHECKING:
    from tuner.backends.kubernetes.backend import KubernetesBackend

log = logging.getLogger("tunehub.backends.kubernetes")

#: How long after the pod's deadline the tuner still waits for its Job's end (the Job
#: controller's own lag; a Job Kueue holds suspended does not run down its deadline).
GRACE_SECONDS = 120.0


class JobWaiters:
    """Jobs someone waits to see end, fed by the backend's Job watch: no watch or poll of
    their own."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[tuple[EventKind, str]]] = {}

    def expect(self, name: str) -> asyncio.Future[tuple[EventKind, str]]:
        """A future of Job ``name``'s outcome, registered before the Job is created."""
        future: asyncio.Future[tuple[EventKind, str]] = (
            asyncio.get_running_loop().create_future())
        self._waiting[name] = future
        return future

    def forget(self, name: str) -> None:
        self._waiting.pop(name, None)

    def on_job(self, job: dict[str, Any], deleted: bool) -> bool:
        """Whether ``job`` is one waited for (then its outcome, if it has one, is told)."""
        future = self._waiting.get(job["metadata"]["name"])
        if future is None:
            return False
        outcome = job_outcome(job)
        if outcome is None and deleted:
            outcome = (EventKind.FAILED, "its Job was deleted")
        if outcome is not None and not future.done():
            future.set_result(outcome)
        return True

    def on_pod(self, pod: dict[str, Any]) -> bool:
        """Whether ``pod`` belongs to a Job waited for; one that can never run (its image,
        its mount) ends the wait at once: its Job would only end at its deadline."""
        job = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")
        future = self._waiting.get(job)
        if future is None:
            return False
        problem = pod_problem(pod)
        if problem is not None and problem.kind == "fatal" and not future.done():
            future.set_result((EventKind.FAILED, problem.reason))
        return True


class KubernetesMeasurer(Measurer):
    """Measures candidates in measuring pods through ``backend``'s connection and watches."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def measure(self, candidate: Candidate) -> dict[str, float]:
        """Stage the copy (file work, in this worker thread), then run the pod from the
        backend's event loop and wait for its answer here."""
        from tuner.serving.intake import copy_model

        loop = self.backend.loop
        if loop is None:
            raise CostError("the Kubernetes backend is not started")
        tag = secrets.token_hex(3)
        settings = self.backend.settings
        stage = candidate.staging / f"s{candidate.sweep_id}-t{candidate.trial_id}-{tag}"
        measurement = cost_pod.Measurement(
            candidate.sweep_id, candidate.trial_id, candidate.owner, stage / "model", tag,
            candidate.priority, candidate.memory, candidate.method)
        try:
            candidate.staging.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mkdir(stage, 0o755)
            copy_model(candidate.source, stage / "model", candidate.max_bytes, candidate.trusted)
            m.relative_to_data(settings, stage)  # the pod can mount it (a ValueError if not)
            running = asyncio.run_coroutine_threadsafe(self._in_pod(measurement), loop)
            return running.result(settings.measure_timeout + 2 * GRACE_SECONDS)
        except ValueError as exc:
            raise CostError(str(exc)) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    async def _in_pod(self, measurement: cost_pod.Measurement) -> dict[str, float]:
        kube, settings = self.backend._api(), self.backend.settings
        body = cost_pod.job(settings, measurement)
        name = body["metadata"]["name"]
        ended = self.backend.waiters.expect(name)
        try:
            try:
                job = await kube.create(body)
                await kube.create(cost_pod.no_network(settings, measurement, job))
            except Exception as exc:
                raise CostError(f"the cluster refused the measuring pod: {describe(exc)}"
                                ) from None
            wait = settings.measure_timeout + GRACE_SECONDS
            try:
                kind, reason = await asyncio.wait_for(asyncio.shield(ended), wait)
            except asyncio.TimeoutError:
                raise CostError(f"the measuring pod {name} did not end within {wait:g} s"
                                ) from None
            pods = await job_pods(kube, name, m.selector(settings))
            text = await self._log(pods)
            if kind == EventKind.SUCCEEDED:
                return parse_report(text or "")
            raise CostError(self._failure(name, reason, pods, text))
        finally:
            self.backend.waiters.forget(name)
            await asyncio.shield(self._delete(name))

    async def _log(self, pods: list[dict[str, Any]]) -> str | None:
        """The first pod's output through the log API, at most :data:`LOG_BYTES` of it."""
        if not pods:
            return None
        return await self.backend._api().pod_log(pods[0]["metadata"]["name"], LOG_BYTES)

    @staticmethod
    def _failure(name: str, reason: str, pods: list[dict[str, Any]], text: str | None) -> str:
        """Why the measuring Job failed, in words: the pod's own error when it said one (the
        model cannot be served), else eviction, the pod's failure (OOMKilled, exit code), or
        the Job controller's reason (the deadline)."""
        if text:
            try:
                parse_report(text)
            except CostError as exc:
                if "result lines" not in str(exc):
                    return str(exc)
        if "DeadlineExceeded" in reason or "timed out" in reason:
            return (f"the measuring pod {name} ran past its deadline "
                    "(TUNEHUB_K8S_MEASURE_TIMEOUT, DeadlineExceeded)")
        for pod in pods:
            conditions = (pod.get("status") or {}).get("conditions") or []
            evicted = next((c for c in conditions if c.get("type") == "DisruptionTarget"
                            and c.get("status") == "True"), None)
            if evicted is not None:
                return (f"the measuring pod {name} was evicted: "
                        f"{evicted.get('message') or evicted.get('reason', '')}".rstrip(": "))
        failure = next((f for f in map(pod_failure, pods) if f), None)
        return f"the measuring pod {name} failed: {failure or reason}"

    async def _delete(self, name: str) -> None:
        try:
            await self.backend._api().delete_job(name)
        except Exception as exc:  # its TTL, or the sweep's cleanup, removes it later
            log.warning("deleting measuring Job %s: %s", name, describe(exc))

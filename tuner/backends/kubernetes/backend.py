"""Trials as Kubernetes Jobs: one ``batch/v1`` Job per attempt, watched, never polled.

Two watches (Jobs and pods labelled ``app.kubernetes.io/managed-by=tunehub`` and this
release's ``app.kubernetes.io/instance`` in the namespace: :func:`.manifests.selector`, the one
selector of every list, watch and delete) feed every attempt's events, so the API load per
trial is constant: create the Job, its token Secret and its NetworkPolicy, read the log once at
the end (through the log API), delete the Job when cancelled or at cleanup. A
third watch follows the Job controller's ``FailedCreate`` Events: an attempt whose pods the
cluster refuses for now (namespace quota full, Pod Security) waits and says why.

Restart safety: Job names are deterministic, so a second create of the same attempt is a
409 that adopts the existing Job; :meth:`reconcile` adopts running Jobs of a sweep by label and
deletes the rest; and one trial never runs two attempts at once (launching attempt N+1 stops
any attempt of that trial still alive).

Keeping the watches alive is :mod:`.watch`'s job, reading pods after the fact (the log at the
end, a failure the pod watch missed) :mod:`.job_pods`'s; this module decides what each object
means for its attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from tuner.backends._base import Backend, TrialEvent, TrialLaunch
from tuner.backends.kubernetes import kueue
from tuner.backends.kubernetes import manifests as m
from tuner.backends.kubernetes.api import (
    ClusterUnavailable,
    Kube,
    connect,
    describe,
)
from tuner.backends.kubernetes.checks import check_spec
from tuner.backends.kubernetes.job_pods import JOB_NAME_LABEL, first_failure, job_pods, save_log
from tuner.backends.kubernetes.measuring import JobWaiters, KubernetesMeasurer
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.backends.kubernetes.status import job_outcome, job_started, pod_failure, pod_problem
from tuner.backends.kubernetes.watch import Listed, Watch
from tuner.backends.kubernetes.workdir import hand_to_trial
from tuner.lifecycle.states import CANCELLED_REASON, EventKind
from tuner.sdk.training import ENV_TOKEN
from tuner.spec import Resources, SweepSpec

log = logging.getLogger("tunehub.backends.kubernetes")

START_TIMEOUT = 60.0
#: Seconds a Job Kueue suspended waits for its Workload's Evicted condition (the reason)
#: before its attempt ends preempted without it.
EVICTION_WAIT = 30.0
#: The Job controller's Events for pods it cannot create (quota, Pod Security, ...).
FAILED_CREATE = "involvedObject.kind=Job,reason=FailedCreate"
#: Refusals of a trial's pod that no waiting fixes (the pod spec itself is at fault): the
#: namespace's Pod Security level, its LimitRange bounds.
NEVER_ADMITTED = ("violates PodSecurity", "usage per Container is", "usage per Pod is")


@dataclass
class _Attempt:
    launch: TrialLaunch
    job: str
    gpus: int
    started: bool = False
    confirmed: bool = False  # the Job is known to exist (created, adopted or watched)
    done: bool = False
    stop_reason: str | None = None
    pod_reason: str | None = None
    waiting: str | None = None  # why its pods cannot be created yet (last reported)
    workload: dict[str, Any] | None = None  # its Kueue Workload, as last watched
    evicted: str | None = None  # Kueue evicted it (the Workload's message): it is preempted
    last_job: dict[str, Any] | None = None  # its Job, as last watched
    eviction_wait: asyncio.TimerHandle | None = None  # suspended: Kueue's word awaited
    pods: set[str] = field(default_factory=set)
    unschedulable: asyncio.TimerHandle | None = None


class KubernetesBackend(Backend):
    """Runs attempts as Jobs in one namespace; see :mod:`.settings` for the configuration."""

    name = "kubernetes"

    def __init__(self, settings: KubeSettings) -> None:
        super().__init__()
        self.settings = settings
        self.kube: Kube | None = None
        self._attempts: dict[str, _Attempt] = {}  # by Job name
        self._by_key: dict[tuple[int, int], str] = {}
        self._held: dict[str, deque[TrialLaunch]] = {}  # over the per-user cap, by owner
        self._watches: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        #: A Workload changed: queue positions may have moved (see :meth:`_follow_queue`).
        self._queue_moved = asyncio.Event()
        #: The namespace's Kueue Workloads by the name of their Job, as last watched: an
        #: attempt adopted after a restart finds what Kueue said of it meanwhile.
        self._workloads: dict[str, dict[str, Any]] = {}
        #: Measuring Jobs (serving cost) awaited through the Job watch (:mod:`.measuring`).
        self.waiters = JobWaiters()
        #: The event loop of the watches, where a measurement's calls are made.
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_env(cls) -> KubernetesBackend:
        """Settings from ``TUNEHUB_K8S_*`` / ``KUBECONFIG``; connects only in :meth:`start`."""
        return cls(KubeSettings.from_env())

    # --- submission checks ---------------------------------------------------------------

    def check(self, spec: SweepSpec) -> None:
        """Refuse what can never run, at submission (see :func:`.checks.check_spec`)."""
        check_spec(self.settings, spec)

    def measurer(self) -> KubernetesMeasurer:
        """Candidates are measured in measuring pods (:mod:`.measuring`): the tuner's own
        pod, which holds a ServiceAccount token, runs no model."""
        return KubernetesMeasurer(self)

    # --- capacity ------------------------------------------------------------------------

    def _usage(self, owner: str) -> tuple[int, int]:
        live = [a for a in self._attempts.values() if not a.done and a.launch.owner == owner]
        return sum(a.gpus for a in live), len(live)

    def can_launch(self, resources: Resources, owner: str | None = None) -> bool:
        """Within the per-user caps (when the caller names the owner); the cluster's own
        capacity is the scheduler's (or Kueue's) business: pending Jobs wait there."""
        if owner is None:
            return True
        return self._within_caps(owner, resources)

    def _within_caps(self, owner: str, res: Resources) -> bool:
        s = self.settings
        gpus, trials = self._usage(owner)
        if s.max_trials_per_user and trials + 1 > s.max_trials_per_user:
            return False
        want = res.gpu * res.workers
        return not (want and s.max_gpus_per_user and gpus + want > s.max_gpus_per_user)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.kube is not None:
            return
        self.kube = Kube(await connect(self.settings), self.settings.namespace)
        self.loop = asyncio.get_running_loop()
        mine = m.selector(self.settings)
        watches = [
            Watch(self.kube, "jobs", (mine, None), self._on_job, self._known_jobs),
            Watch(self.kube, "pods", (mine, None), self._on_pod),
            Watch(self.kube, "events", ("", FAILED_CREATE), self._on_event, if_forbidden=(
                "may not watch Events: trials waiting for their pods (quota, Pod Security) "
                "cannot say why")),
        ]
        if self.settings.queue:
            watches.append(Watch(self.kube, "workloads", ("", None), self._on_workload,
                                 if_forbidden=("may not watch Kueue Workloads: trials waiting "
                                               "in the queue cannot say why, and one Kueue "
                                               "evicts is not known as preempted")))
        loop = asyncio.get_running_loop()
        self._watches = [loop.create_task(w.run(), name=f"k8s-watch-{w.kind}") for w in watches]
        if self.settings.queue:
            self._watches.append(loop.create_task(self._follow_queue(), name="k8s-kueue-queue"))
        error = ""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(w.ready.wait() for w in watches)), START_TIMEOUT
            )
        except asyncio.TimeoutError:
            error = f"no answer in {START_TIMEOUT:g}s"
        error = next((w.error for w in watches if w.error), error)
        if error:
            await self.close()
            raise ClusterUnavailable(
                f"cannot watch Jobs and pods in namespace {self.settings.namespace!r}: {error}"
            )

    async def close(self) -> None:
        for task in self._watches:
            task.cancel()
        await asyncio.gather(*self._watches, *self._tasks, return_exceptions=True)
        self._watches.clear()
        for att in self._attempts.values():
            for timer in (att.unschedulable, att.eviction_wait):
                if timer is not None:
                    timer.cancel()
        if self.kube is not None:
            await self.kube.close()
            self.kube = None

    def _api(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("KubernetesBackend.start() was not called")
        return self.kube

    # --- launching -----------------------------------------------------------------------

    async def launch(self, launch: TrialLaunch) -> None:
        # One attempt per trial at a time, whatever the caller believes.
        for key, name in list(self._by_key.items()):
            if key[0] == launch.trial_id and key[1] != launch.attempt:
                await self._stop(self._attempts[name], f"superseded by attempt {launch.attempt}")
        if not self._within_caps(launch.owner, launch.resources):
            self._held.setdefault(launch.owner, deque()).append(launch)
            return
        await self._create(launch)

    async def _create(self, launch: TrialLaunch) -> None:
        kube = self._api()
        try:
            body = m.job(self.settings, launch)
        except ValueError as exc:
            await self._emit(launch, EventKind.FAILED, str(exc))
            return
        name = body["metadata"]["name"]
        att = _Attempt(launch, name, launch.resources.gpu * launch.resources.workers)
        self._attempts[name] = att
        self._by_key[launch.key] = name
        adopted = False
        try:
            hand_to_trial(self.settings.data_path, launch.workdir, launch.log_path,
                          self.settings.run_as_group)
        except OSError as exc:
            self._forget(att)
            await self._emit(launch, EventKind.FAILED,
                             f"the trial's directory {launch.workdir}: {describe(exc)}")
            return
        try:
            try:
                job = await kube.create(body)
            except ApiException as exc:
                existing = await kube.get_job(name) if exc.status == 409 else None
                if existing is None:
                    raise
                job, adopted = existing, True  # created before a restart: adopt, never twice
        except Exception as exc:  # refused (403/422) or unreachable: the attempt failed
            self._forget(att)
            await self._emit(launch, EventKind.FAILED,
                             f"the cluster refused the Job: {describe(exc)}")
            return
        try:
            token = launch.env.get(ENV_TOKEN, "")
            owned = [m.token_secret(self.settings, launch, token, job),
                     m.island_policy(self.settings, launch, job)]
            if launch.resources.workers > 1:
                owned.append(m.worker_service(self.settings, launch, job))
            for obj in owned:
                try:
                    await kube.create(obj)
                except ApiException as exc:
                    # An adopted Job's objects exist already: its pods hold that Secret's
                    # token. Never patched: the tuner may not change a Secret (RBAC).
                    if exc.status != 409 or not adopted:
                        raise
        except Exception as exc:
            await self._stop(att, f"could not create the trial's objects: {describe(exc)}")
            return
        await self._on_job(job)

    # --- stopping ------------------------------------------------------------------------

    async def cancel(self, trial_id: int, attempt: int) -> None:
        name = self._by_key.get((trial_id, attempt))
        if name is not None:
            await self._stop(self._attempts[name], CANCELLED_REASON)
            return
        for held in self._held.values():
            for launch in list(held):
                if launch.key == (trial_id, attempt):
                    held.remove(launch)
                    await self._emit(launch, EventKind.FAILED, CANCELLED_REASON)
                    return

    async def _stop(self, att: _Attempt, reason: str) -> None:
        """Delete the Job (its pods, Secret and Service follow) and fail the attempt now."""
        if att.done:
            return
        att.stop_reason = reason
        try:
            await self._api().delete_job(att.job)
        except Exception as exc:  # its TTL or cleanup() removes it later
            log.warning("deleting Job %s: %s", att.job, describe(exc))
        await self._finish(att, EventKind.FAILED, reason)

    async def _finish(self, att: _Attempt, kind: EventKind, reason: str = "") -> None:
        if att.done:
            return
        att.done = True
        if att.unschedulable is not None:
            att.unschedulable.cancel()
        if att.eviction_wait is not None:
            att.eviction_wait.cancel()
        if kind == EventKind.SUCCEEDED or att.stop_reason is None:
            try:
                await save_log(self._api(), att.job, m.selector(self.settings), att.pods,
                               self.settings.data_path, att.launch.log_path)
            except Exception as exc:  # the outcome matters more than the log
                log.warning("reading the log of Job %s: %s", att.job, describe(exc))
        self._forget(att)
        await self._emit(att.launch, kind, reason)
        await self._release_held(att.launch.owner)

    def _forget(self, att: _Attempt) -> None:
        self._attempts.pop(att.job, None)
        if self._by_key.get(att.launch.key) == att.job:
            del self._by_key[att.launch.key]

    async def _emit(self, launch: TrialLaunch, kind: EventKind, reason: str = "") -> None:
        code = 0 if kind == EventKind.SUCCEEDED else None
        await self.emit(TrialEvent(launch.trial_id, launch.attempt, kind, code, reason))

    async def _release_held(self, owner: str) -> None:
        held = self._held.get(owner)
        while held and self._within_caps(owner, held[0].resources):
            await self._create(held.popleft())

    # --- watching ------------------------------------------------------------------------

    def _known_jobs(self) -> Listed:
        """As the Jobs are listed again (after the watch was down): what to call with the list
        to finish the attempts whose Job existed before and is gone from it, deleted meanwhile
        (by someone else, or by their TTL)."""
        known = [a for a in self._attempts.values() if a.confirmed]

        async def vanished(jobs: list[dict[str, Any]]) -> None:
            names = {j["metadata"]["name"] for j in jobs}
            for att in known:
                if att.job not in names and not att.done:
                    await self._finish(att, EventKind.FAILED,
                                       att.stop_reason or "its Job vanished")

        return vanished

    async def _on_job(self, job: dict[str, Any], deleted: bool = False) -> None:
        if self.waiters.on_job(job, deleted):
            return  # a measuring Job (serving cost)
        att = self._attempts.get(job["metadata"]["name"])
        if att is None or att.done:
            return
        att.confirmed = True
        att.last_job = job
        if att.workload is None and att.job in self._workloads:
            await self._on_workload(self._workloads[att.job])  # adopted: what Kueue said
            if att.done:
                return
        outcome = job_outcome(job)
        if outcome is None and (job.get("spec") or {}).get("suspend") and (
                att.started or att.evicted):
            await self._on_evicted(att, job)
            return
        if outcome is not None:
            kind, reason = outcome
            if kind == EventKind.FAILED and "DeadlineExceeded" not in reason:
                reason = att.pod_reason or await self._pod_reason(att) or reason
            await self._finish(att, kind, reason)
        elif deleted:
            await self._finish(att, EventKind.FAILED, att.stop_reason or "its Job was deleted")
        elif job_started(job) and not att.started:
            att.started = True
            att.waiting = None  # what it waited for (quota, Kueue) is over
            await self._emit(att.launch, EventKind.STARTED)

    # --- Kueue ---------------------------------------------------------------------------

    async def _on_evicted(self, att: _Attempt, job: dict[str, Any], late: bool = False
                          ) -> None:
        """Kueue suspended the running Job again (evicted: a higher-priority workload or
        a notebook took its quota). Once its pods are gone (SIGTERM, the grace period: the
        trial saves a checkpoint), the Job is deleted so that Kueue does not run this attempt
        again beside the next one, and the attempt ends ``preempted``: the trial goes back
        to the queue with its number and parameters, not failed, no retry used."""
        status = job.get("status") or {}
        if att.done or status.get("active") or status.get("terminating"):
            return  # its pods are still stopping
        why = att.evicted or (kueue.eviction(att.workload) if att.workload else None)
        if why is None and not late and self.settings.queue:
            # Kueue's word (the Workload's Evicted condition) is on another watch and may
            # come after the Job's: wait for it (_on_workload), not longer than this.
            if att.eviction_wait is None:
                att.eviction_wait = asyncio.get_running_loop().call_later(
                    EVICTION_WAIT, lambda: self._in_task(
                        self._on_evicted(att, att.last_job or job, late=True)))
            return
        if att.eviction_wait is not None:
            att.eviction_wait.cancel()
        reason = (f"preempted: Kueue evicted it ({why or 'its Job was suspended'}); it "
                  "resumes from its last checkpoint")
        att.stop_reason = reason  # its pods are gone: no log to read
        try:
            await self._api().delete_job(att.job)
        except Exception as exc:  # its TTL or cleanup() removes it later
            log.warning("deleting evicted Job %s: %s", att.job, describe(exc))
        await self._finish(att, EventKind.PREEMPTED, reason)

    async def _on_workload(self, workload: dict[str, Any], deleted: bool = False) -> None:
        """Kueue's Workload of an attempt's Job: an eviction is remembered for the Job's
        suspension (:meth:`_on_evicted`); any change may move the queue's positions."""
        self._queue_moved.set()
        job = kueue.workload_job(workload)
        if job is None:
            return  # a notebook's
        if deleted:
            self._workloads.pop(job, None)
            return
        self._workloads[job] = workload
        att = self._attempts.get(job)
        if att is None or att.done:
            return
        att.workload = workload
        evicted = kueue.eviction(workload)
        if evicted and not att.evicted:
            att.evicted = evicted
            suspended = att.last_job is not None and (att.last_job.get("spec") or {}).get(
                "suspend")
            if suspended and job_outcome(att.last_job or {}) is None:
                await self._on_evicted(att, att.last_job or {})

    async def _follow_queue(self) -> None:
        """Each waiting attempt's reason, with its place in the queue: after Workloads change,
        one read of the visibility API for the LocalQueue (the positions are not watchable)."""
        queue = (f"ClusterQueue {self.settings.cluster_queue}" if self.settings.cluster_queue
                 else f"LocalQueue {self.settings.queue}")
        while True:
            await self._queue_moved.wait()
            self._queue_moved.clear()
            try:
                await self._tell_places(queue)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad answer must not end the reasons of every trial
                log.exception("telling waiting trials their place in the queue")

    async def _tell_places(self, queue: str) -> None:
        """The reason of each attempt waiting in Kueue, with its position."""
        waiting = [a for a in self._attempts.values() if not a.done and not a.started
                   and a.workload is not None
                   and kueue.waiting_reason(a.workload, queue, None) is not None]
        if not waiting:
            return
        try:
            summary = await self._api().pending_workloads(self.settings.queue)
        except Exception as exc:  # positions are a nicety: say why without them
            log.warning("reading Kueue's pending workloads: %s", describe(exc))
            summary = None
        places = kueue.positions(summary) if summary is not None else {}
        for att in waiting:
            if att.done or att.started or att.workload is None:
                continue
            reason = kueue.waiting_reason(att.workload, queue, places.get(att.job))
            if reason is not None and reason != att.waiting:
                att.waiting = reason
                await self._emit(att.launch, EventKind.WAITING, reason)

    async def _pod_reason(self, att: _Attempt) -> str | None:
        """The Job failed before the pod watch told us why: read its pods once."""
        try:
            pods = await job_pods(self._api(), att.job, m.selector(self.settings))
        except Exception as exc:
            log.warning("listing the pods of Job %s: %s", att.job, describe(exc))
            return None
        att.pods.update(pod["metadata"]["name"] for pod in pods)
        return first_failure(pods)

    async def _on_event(self, event: dict[str, Any], deleted: bool = False) -> None:
        """The Job controller could not create an attempt's pod (the namespace's quota is
        full, Pod Security refuses it, its PriorityClass is missing...). It keeps retrying,
        so the attempt waits, and says why, until its pods run."""
        att = self._attempts.get((event.get("involvedObject") or {}).get("name", ""))
        if deleted or att is None or att.done or att.started:
            return
        message = str(event.get("message") or "").removeprefix("Error creating: ")
        if any(rule in message for rule in NEVER_ADMITTED):
            await self._stop(att, f"the cluster refuses its pods: {message}")
            return
        reason = f"waiting: the cluster does not create its pod yet: {message}"
        if reason != att.waiting:
            att.waiting = reason
            await self._emit(att.launch, EventKind.WAITING, reason)

    async def _on_pod(self, pod: dict[str, Any], deleted: bool = False) -> None:
        if self.waiters.on_pod(pod):
            return  # a measuring pod (serving cost)
        labels = pod["metadata"].get("labels") or {}
        job = labels.get(JOB_NAME_LABEL) or labels.get("job-name")
        att = self._attempts.get(job or "")
        if att is None or att.done:
            return
        att.pods.add(pod["metadata"]["name"])
        failure = pod_failure(pod)
        if failure:
            att.pod_reason = failure
        problem = None if deleted else pod_problem(pod)
        if problem is None:
            if att.unschedulable is not None:
                att.unschedulable.cancel()
                att.unschedulable = None
            if att.waiting and (pod.get("status") or {}).get("phase") == "Running":
                att.waiting = None  # it waited for a node: started again, the reason cleared
                await self._emit(att.launch, EventKind.STARTED)
            return
        timeout = self.settings.unschedulable_timeout
        if problem.kind == "fatal" or timeout == 0:
            await self._stop(att, problem.reason)
        elif timeout is None:  # it waits its turn, and says why
            reason = f"waiting: {problem.reason}"
            if reason != att.waiting:
                att.waiting = reason
                await self._emit(att.launch, EventKind.WAITING, reason)
        elif att.unschedulable is None:
            att.unschedulable = asyncio.get_running_loop().call_later(
                timeout, self._unschedulable_expired, att,
                f"{problem.reason} (waited {timeout:g}s)",
            )

    def _in_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _unschedulable_expired(self, att: _Attempt, reason: str) -> None:
        task = asyncio.get_running_loop().create_task(self._stop(att, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- restart and cleanup -------------------------------------------------------------

    async def _sweep_jobs(self, sweep_id: int) -> list[dict[str, Any]]:
        listed = await self._api().list(
            "jobs", f"{m.selector(self.settings)},{m.SWEEP_LABEL}={sweep_id}")
        return list(listed.get("items") or [])

    async def reconcile(self, sweep_id: int, running: list[TrialLaunch]) -> set[tuple[int, int]]:
        """Adopt the unfinished Jobs of ``running`` attempts; delete every other Job of the
        sweep (older attempts, finished ones) so nothing runs beside a relaunch."""
        wanted = {m.job_name(self.settings, sweep_id, r.trial_id, r.attempt): r
                  for r in running}
        adopted: set[tuple[int, int]] = set()
        for job in await self._sweep_jobs(sweep_id):
            name = job["metadata"]["name"]
            launch = wanted.get(name)
            if launch is not None and job_outcome(job) is None and not job["metadata"].get(
                "deletionTimestamp"
            ):
                annotations = job["metadata"].get("annotations") or {}
                launch = replace(launch, owner=annotations.get(m.OWNER_ANNOTATION, ""))
                if not str(launch.log_path) or launch.log_path == Path():
                    launch = replace(launch, log_path=Path(annotations.get(m.LOG_ANNOTATION, "")))
                att = self._attempts.get(name) or _Attempt(
                    launch, name, int(annotations.get(m.GPUS_ANNOTATION, "0") or 0)
                )
                self._attempts[name] = att
                self._by_key[launch.key] = name
                adopted.add(launch.key)
                await self._ensure_island(launch, job)
                await self._on_job(job)
            else:
                await self._api().delete_job(name)
        return adopted

    async def _ensure_island(self, launch: TrialLaunch, job: dict[str, Any]) -> None:
        """An adopted Job's NetworkPolicy: there already (409) unless the Job was made by a
        tuner from before per-attempt islands, whose workers would otherwise not reach each
        other under the chart's trial policy (it admits no trial)."""
        try:
            await self._api().create(m.island_policy(self.settings, launch, job))
        except ApiException as exc:
            if exc.status != 409:
                log.warning("the NetworkPolicy of Job %s: %s", job["metadata"]["name"],
                            describe(exc))

    async def cleanup(self, sweep_id: int) -> None:
        """Delete the sweep's Jobs (their pods, Secrets and Services go with them). Best
        effort: what fails here is removed by the Jobs' TTL or the next cleanup."""
        try:
            for job in await self._sweep_jobs(sweep_id):
                name = job["metadata"]["name"]
                att = self._attempts.get(name)
                if att is not None and not att.done:
                    continue  # still reported on by a controller
                if not job["metadata"].get("deletionTimestamp"):
                    await self._api().delete_job(name)
        except Exception as exc:
            log.warning("cleaning up the Jobs of sweep %s: %s", sweep_id, describe(exc))

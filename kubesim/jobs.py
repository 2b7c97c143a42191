"""The Job controller stand-in: creates pods for batch/v1 Jobs (NonIndexed and Indexed,
parallelism, completions, suspend), tracks succeeded/failed pods (OnFailure restarts count
toward backoffLimit), enforces backoffLimit and activeDeadlineSeconds, writes Job status and
conditions with the real reasons, and deletes finished Jobs after ttlSecondsAfterFinished."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import re

from .admission import now
from .client import ApiFailure, HarnessClient, Informer, path_of
from .nodes import TERMINAL
from .objects import JSON

log = logging.getLogger(__name__)

INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def _ts(value: str) -> float:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.timezone.utc).timestamp()


def _finished(job: JSON) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"]
    return None


def _index(pod: JSON) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    return int(value) if value is not None else None


def _compress(indexes: set[int]) -> str:
    """``{0,1,2,4}`` -> ``"0-2,4"`` as in status.completedIndexes."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def pod_failure_action(spec: JSON, pod: JSON) -> tuple[str | None, str]:
    """The ``podFailurePolicy`` rule matching a failed pod: (action, message) or (None, "")."""
    meta, status = pod["metadata"], pod.get("status") or {}
    where = f"{meta['namespace']}/{meta['name']}"
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        action, codes = rule["action"], rule.get("onExitCodes")
        if codes:
            for cs in status.get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated")
                if not term or term["exitCode"] == 0 or (
                        codes.get("containerName") not in (None, cs["name"])):
                    continue
                hit = term["exitCode"] in codes["values"]
                if hit == (codes["operator"] == "In"):
                    return action, (f"Container {cs['name']} for pod {where} failed with exit "
                                    f"code {term['exitCode']} matching {action} rule at index "
                                    f"{i}")
        for pattern in rule.get("onPodConditions") or []:
            for c in status.get("conditions") or []:
                if c["type"] == pattern["type"] and c["status"] == pattern.get("status",
                                                                               "True"):
                    return action, (f"Pod {where} has condition {c['type']} matching "
                                    f"{action} rule at index {i}")
    return None, ""


class JobController:
    def __init__(self, url: str) -> None:
        self.client = HarnessClient(url, "job-controller")
        self.jobs = Informer(self.client, "/apis/batch/v1/jobs", self._on_job)
        self.pods = Informer(self.client, "/api/v1/pods", self._on_pod)
        self.failed: dict[str, set[str]] = {}  # job uid -> uids of pods counted as failed
        self.succeeded: dict[str, set[str]] = {}
        self._deleting: set[str] = set()  # pod uids we deleted on purpose
        self.fail_job: dict[str, str] = {}  # job uid -> message of a matched FailJob rule
        self._create_errors: dict[str, str] = {}
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()  # dedupe: one pending reconcile per Job
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self.pods.run()),
                       asyncio.create_task(self.jobs.run()),
                       asyncio.create_task(self._worker()),
                       asyncio.create_task(self._ticker())]
        await asyncio.wait_for(self.pods.synced.wait(), 30)
        await asyncio.wait_for(self.jobs.synced.wait(), 30)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    async def _on_job(self, type_: str, job: JSON) -> None:
        if type_ == "DELETED":
            uid = job["metadata"]["uid"]
            self.failed.pop(uid, None)
            self.succeeded.pop(uid, None)
            return
        self._enqueue((job["metadata"]["namespace"], job["metadata"]["name"]))

    def _owner(self, pod: JSON) -> JSON | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("controller"):
                job = self.jobs.cache.get((pod["metadata"]["namespace"], ref["name"]))
                if job is not None and job["metadata"]["uid"] == ref["uid"]:
                    return job
        return None

    async def _on_pod(self, type_: str, pod: JSON) -> None:
        job = self._owner(pod)
        if job is None:
            return
        juid, puid = job["metadata"]["uid"], pod["metadata"]["uid"]
        phase = pod["status"].get("phase")
        if phase == "Succeeded":
            self.succeeded.setdefault(juid, set()).add(puid)
        elif phase == "Failed" or (type_ == "DELETED" and puid not in self._deleting):
            action, message = pod_failure_action(job["spec"], pod)
            if action == "FailJob":
                self.fail_job.setdefault(juid, message)
            if action != "Ignore":
                self.failed.setdefault(juid, set()).add(puid)
        if type_ == "DELETED":
            self._deleting.discard(puid)
        self._enqueue((job["metadata"]["namespace"], job["metadata"]["name"]))

    async def _ticker(self) -> None:
        """Deadlines and TTLs are time-based: re-check every Job twice a second."""
        while True:
            await asyncio.sleep(0.5)
            for ns, name in list(self.jobs.cache):
                self._enqueue((ns, name))

    def _enqueue(self, key: tuple[str, str]) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            job = self.jobs.cache.get(key)
            if job is None:
                continue
            try:
                await self.reconcile(job)
            except Exception:
                log.exception("reconciling job %s/%s failed", *key)

    def _pods_of(self, job: JSON) -> list[JSON]:
        uid = job["metadata"]["uid"]
        return [p for p in self.pods.cache.values()
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    async def reconcile(self, job: JSON) -> None:
        spec, uid = job["spec"], job["metadata"]["uid"]
        status = copy.deepcopy(job.get("status") or {})
        if job["metadata"].get("deletionTimestamp"):
            return  # being deleted (foreground): the garbage collector handles its pods
        finished = _finished(job)
        if finished:
            await self._maybe_ttl(job)
            return
        pods = self._pods_of(job)
        active = [p for p in pods if p["status"].get("phase") not in TERMINAL
                  and p["metadata"]["uid"] not in self._deleting
                  and not p["metadata"].get("deletionTimestamp")]
        terminating = sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))
        failed = len(self.failed.get(uid, ()))
        if spec["template"]["spec"].get("restartPolicy") == "OnFailure":
            failed_total = failed + sum(s.get("restartCount", 0) for p in active
                                        for s in p["status"].get("containerStatuses") or [])
        else:
            failed_total = failed
        indexed = spec.get("completionMode") == "Indexed"
        done_pods = [p for p in pods if p["metadata"]["uid"] in self.succeeded.get(uid, ())]
        # an Indexed Job's pods carry their index (this controller made them)
        done_idx = {i for i in map(_index, done_pods) if i is not None} if indexed else set()
        succeeded = len(done_idx) if indexed else len(self.succeeded.get(uid, ()))
        completions = spec.get("completions")
        if spec.get("suspend"):
            await self._delete_pods(active)
            status.pop("startTime", None)
            status["conditions"] = self._set_condition(status, "Suspended", "True", "JobSuspended",
                                                       "Job suspended")
            active = []
        else:
            if any(c["type"] == "Suspended" and c["status"] == "True"
                   for c in status.get("conditions") or []):
                status["conditions"] = self._set_condition(status, "Suspended", "False",
                                                           "JobResumed", "Job resumed")
            status.setdefault("startTime", now())
            failure = self._failure(spec, status, failed_total)
            if uid in self.fail_job:
                failure = ("PodFailurePolicy", self.fail_job[uid])
            if failure:
                await self._delete_pods(active)
                reason, message = failure
                for t in ("FailureTarget", "Failed"):
                    status["conditions"] = self._set_condition(status, t, "True", reason,
                                                               message)
                active = []
            elif (completions is not None and succeeded >= completions) or (
                    completions is None and succeeded and not active):
                # a work-queue Job (no completions) is done once one pod succeeded and the
                # rest have finished
                await self._delete_pods(active)
                active = []
                for t in ("SuccessCriteriaMet", "Complete"):
                    status["conditions"] = self._set_condition(
                        status, t, "True", "CompletionsReached",
                        "Reached expected number of succeeded pods")
                status["completionTime"] = now()
            else:
                active += await self._create_pods(job, active, done_idx, succeeded)
        status.update({"active": len(active), "succeeded": succeeded, "failed": failed,
                       "ready": sum(1 for p in active if p["status"].get("phase") == "Running"),
                       "terminating": terminating})
        if indexed:
            status["completedIndexes"] = _compress(done_idx)
        for k in ("active", "succeeded", "failed"):
            if status[k] == 0 and k not in (job.get("status") or {}):
                del status[k]
        if status != (job.get("status") or {}):
            await self.client.replace_status(path_of(job), status)

    @staticmethod
    def _failure(spec: JSON, status: JSON, failures: int) -> tuple[str, str] | None:
        if failures > spec.get("backoffLimit", 6):
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime") and \
                dt.datetime.now(dt.timezone.utc).timestamp() - _ts(status["startTime"]) >= deadline:
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        return None

    @staticmethod
    def _set_condition(status: JSON, type_: str, value: str, reason: str,
                       message: str) -> list[JSON]:
        conds = [c for c in status.get("conditions") or [] if c["type"] != type_]
        same = [c for c in status.get("conditions") or [] if c["type"] == type_
                and c["status"] == value and c.get("reason") == reason]
        if same:
            return conds + same
        stamp = now()
        conds.append({"type": type_, "status": value, "reason": reason, "message": message,
                      "lastProbeTime": stamp, "lastTransitionTime": stamp})
        return conds

    async def _delete_pods(self, pods: list[JSON]) -> None:
        for p in pods:
            self._deleting.add(p["metadata"]["uid"])
            await self.client.delete(path_of(p))

    async def _create_pods(self, job: JSON, active: list[JSON], done_idx: set[int],
                           succeeded: int) -> list[JSON]:
        spec = job["spec"]
        room = spec.get("parallelism", 1) - len(active)
        if spec.get("completionMode") == "Indexed":
            busy = {_index(p) for p in active}
            todo = [i for i in range(spec["completions"]) if i not in done_idx and i not in busy]
            indexes: list[int | None] = list(todo[:max(room, 0)])
        else:
            completions = spec.get("completions")
            if completions is None:  # work queue: no new pods once one has succeeded
                want = 0 if succeeded else spec.get("parallelism", 1)
            else:
                want = min(spec.get("parallelism", 1), completions - succeeded)
            indexes = [None] * max(want - len(active), 0)
        created = []
        for index in indexes:
            pod = self._pod_for(job, index)
            try:
                created.append(await self.client.create(
                    f"/api/v1/namespaces/{job['metadata']['namespace']}/pods", pod))
            except ApiFailure as exc:  # e.g. quota or Pod Security: retried every tick
                await self._failed_create(job, exc.message or str(exc))
                break
            self._create_errors.pop(job["metadata"]["uid"], None)
        return created

    def _pod_for(self, job: JSON, index: int | None) -> JSON:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        tmeta, pspec = template.get("metadata") or {}, template["spec"]
        labels = dict(tmeta.get("labels") or {})
        annotations = dict(tmeta.get("annotations") or {})
        prefix = f"{meta['name']}-"
        if index is not None:
            labels[INDEX_KEY] = annotations[INDEX_KEY] = str(index)
            prefix = f"{meta['name']}-{index}-"
            pspec["hostname"] = f"{meta['name']}-{index}"
            for c in (pspec.get("initContainers") or []) + pspec["containers"]:
                c.setdefault("env", []).append(
                    {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                        "apiVersion": "v1",
                        "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": prefix, "namespace": meta["namespace"],
                             "labels": labels, "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": pspec}

    async def _failed_create(self, job: JSON, message: str) -> None:
        uid = job["metadata"]["uid"]
        # one event per cause, not per retry (each retry's pod has a new generated name)
        key = re.sub(r'^pods "[^"]*"', "pods", message)
        if self._create_errors.get(uid) == key:
            return
        self._create_errors[uid] = key
        meta, stamp = job["metadata"], now()
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                 "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                    "namespace": meta["namespace"], "uid": uid},
                 "reason": "FailedCreate", "message": f"Error creating: {message}",
                 "type": "Warning", "count": 1, "firstTimestamp": stamp, "lastTimestamp": stamp,
                 "source": {"component": "job-controller"}}
        try:
            await self.client.create(f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except ApiFailure:
            log.debug("FailedCreate event not recorded for %s", meta["name"])

    async def _maybe_ttl(self, job: JSON) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        status = job.get("status") or {}
        finished_at = status.get("completionTime") or next(
            (c["lastTransitionTime"] for c in status.get("conditions") or []
             if c["type"] == "Failed"), None)
        if ttl is None or finished_at is None:
            return
        if dt.datetime.now(dt.timezone.utc).timestamp() - _ts(finished_at) >= ttl:
            await self.client.delete(path_of(job), propagation="Background")

"""Scheduler + kubelet stand-in: watches pods over the emulator's HTTP API, binds pending pods
to fake nodes (selectors, affinity, taints, resources, priority, preemption), reports
unschedulable pods like kube-scheduler does, and runs bound pods as local processes."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from .admission import now
from .client import ApiFailure, HarnessClient, Informer, path_of
from .nodes import TERMINAL, FakeNode, choose_node, preemption_victims
from .objects import JSON
from .podnet import PodNetwork
from .runner import PodRunner, Runtime

log = logging.getLogger(__name__)


class Kubelet:
    """One process-wide kubelet for all fake nodes, plus the default scheduler."""

    def __init__(self, url: str, nodes: list[FakeNode], runtime: Runtime) -> None:
        self.url, self.nodes, self.runtime = url, nodes, runtime
        self.client = HarnessClient(url, "kubelet")
        self.pods = Informer(self.client, "/api/v1/pods", self._on_pod)
        self.node_objects = Informer(self.client, "/api/v1/nodes", self._on_node)
        self.runners: dict[str, PodRunner] = {}
        self._dirty = asyncio.Event()
        self._assumed: dict[str, str] = {}  # pod uid -> node, until the cache shows the bind
        self._unschedulable: dict[str, str] = {}  # pod uid -> last reported message
        self._terminating: set[str] = set()  # pod uids being shut down after a delete
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for node in self.nodes:
            try:
                await self.client.create("/api/v1/nodes", node.to_object())
            except ApiFailure as exc:
                if exc.status != 409:
                    raise
        self._tasks = [asyncio.create_task(self.pods.run()),
                       asyncio.create_task(self.node_objects.run()),
                       asyncio.create_task(self._schedule_loop())]
        await asyncio.wait_for(self.pods.synced.wait(), 30)
        await asyncio.wait_for(self.node_objects.synced.wait(), 30)

    async def stop(self) -> None:
        for runner in list(self.runners.values()):
            await runner.kill(0)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    async def _on_node(self, type_: str, node: JSON) -> None:
        self._dirty.set()

    def schedulable_nodes(self) -> list[FakeNode]:
        """The scheduler's view: Node objects as stored in the API (labels, taints,
        allocatable, unschedulable), in the configured order, then any others."""
        order = {n.name: i for i, n in enumerate(self.nodes)}
        objs = sorted(self.node_objects.cache.values(),
                      key=lambda o: (order.get(o["metadata"]["name"], len(order)),
                                     o["metadata"]["name"]))
        return [FakeNode.from_object(o) for o in objs]

    # -- kubelet -------------------------------------------------------------------------------
    async def _on_pod(self, type_: str, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        self._dirty.set()
        if type_ == "DELETED":
            # Runtime.__post_init__ always sets network (None only means "the default one")
            cast(PodNetwork, self.runtime.network).detach(uid)  # lives as long as the pod
            self._terminating.discard(uid)
            self._unschedulable.pop(uid, None)
            self._assumed.pop(uid, None)
            runner = self.runners.pop(uid, None)
            if runner is not None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                asyncio.create_task(runner.kill(float(grace)))
            return
        if pod["metadata"].get("deletionTimestamp"):
            if uid not in self._terminating:
                self._terminating.add(uid)
                asyncio.create_task(self._terminate(pod))
            return
        node = pod["spec"].get("nodeName")
        if node:
            self._assumed.pop(uid, None)
        if (node in {n.name for n in self.nodes} and uid not in self.runners
                and pod["status"].get("phase") not in TERMINAL
                and not pod["status"].get("startTime")):
            runner = PodRunner(self.client, pod, self.runtime)
            self.runners[uid] = runner
            runner.task = asyncio.create_task(self._run(runner))

    async def _terminate(self, pod: JSON) -> None:
        """A Terminating pod: stop its processes within the grace period, then remove it
        from the API (grace 0), as the kubelet does after a graceful delete."""
        runner = self.runners.pop(pod["metadata"]["uid"], None)
        if runner is not None:
            await runner.kill(float(pod["metadata"].get("deletionGracePeriodSeconds", 30)))
        await self.client.delete(path_of(pod), grace=0)

    async def _run(self, runner: PodRunner) -> None:
        try:
            await runner.run()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("pod %s/%s crashed the kubelet runner", runner.namespace, runner.name)

    def process_ids(self) -> dict[str, dict[str, int]]:
        """``{pod name: {container: pid}}`` of live processes (for tests that check kills)."""
        return {r.name: {c: p.pid for c, p in r.procs.items() if p.returncode is None}
                for r in self.runners.values()}

    # -- scheduler -----------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._schedule_pass()
            except Exception:
                log.exception("scheduling pass failed")
                self._dirty.set()
                await asyncio.sleep(0.5)  # do not spin on a persistent error

    def _view(self) -> list[JSON]:
        pods = []
        for pod in self.pods.cache.values():
            node = self._assumed.get(pod["metadata"]["uid"])
            if node and not pod["spec"].get("nodeName"):
                pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
            pods.append(pod)
        return pods

    async def _schedule_pass(self) -> None:
        pods = self._view()
        pending = [p for p in pods if not p["spec"].get("nodeName")
                   and p["status"].get("phase") not in TERMINAL
                   and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
                   and not p["metadata"].get("deletionTimestamp")
                   and not p["spec"].get("schedulingGates")]  # gated: not for scheduling yet
        pending.sort(key=lambda p: (-p["spec"].get("priority", 0),
                                    p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        nodes = self.schedulable_nodes()
        for pod in pending:
            node, message = choose_node(pod, nodes, pods)
            if node is not None:
                if await self._bind(pod, node):
                    pods = [p if p is not pod else {**p, "spec": {**p["spec"],
                                                                 "nodeName": node}}
                            for p in pods]
                continue
            preempt = preemption_victims(pod, nodes, pods)
            if preempt is not None:
                await self._preempt(pod, *preempt)
                pods = [p for p in pods if p not in preempt[1]]
                continue
            await self._unschedulable_pod(pod, message)

    async def _bind(self, pod: JSON, node: str) -> bool:
        meta = pod["metadata"]
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            await self.client.create(path_of(pod) + "/binding", binding)
        except ApiFailure as exc:
            if exc.status in (404, 409):
                return False
            raise
        self._assumed[meta["uid"]] = node
        self._unschedulable.pop(meta["uid"], None)
        await self._event(pod, "Normal", "Scheduled",
                          f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}")
        return True

    async def _preempt(self, pod: JSON, node: str, victims: list[JSON]) -> None:
        for victim in victims:
            status = dict(victim["status"])
            status["conditions"] = [c for c in status.get("conditions", [])
                                    if c["type"] != "DisruptionTarget"] + [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                 "message": f"default-scheduler: preempting to accommodate a higher priority "
                            f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}",
                 "lastProbeTime": None, "lastTransitionTime": now()}]
            await self.client.replace_status(path_of(victim), status)
            await self._event(victim, "Normal", "Preempted",
                              f"Preempted by pod {pod['metadata']['uid']} on node {node}")
            await self.client.delete(path_of(victim))
        status = dict(pod["status"])
        status["nominatedNodeName"] = node
        await self.client.replace_status(path_of(pod), status)

    async def _unschedulable_pod(self, pod: JSON, message: str) -> None:
        uid = pod["metadata"]["uid"]
        if self._unschedulable.get(uid) == message:
            return
        self._unschedulable[uid] = message
        status = dict(pod["status"])
        status["conditions"] = [c for c in status.get("conditions", [])
                                if c["type"] != "PodScheduled"] + [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": message, "lastProbeTime": None, "lastTransitionTime": now()}]
        await self.client.replace_status(path_of(pod), status)
        await self._event(pod, "Warning", "FailedScheduling", message)

    async def _event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        stamp = now()
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                 "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                    "name": meta["name"], "namespace": meta["namespace"],
                                    "uid": meta["uid"]},
                 "reason": reason, "message": message, "type": type_, "count": 1,
                 "firstTimestamp": stamp, "lastTimestamp": stamp,
                 "source": {"component": "default-scheduler"},
                 "reportingComponent": "default-scheduler", "reportingInstance": "harness"}
        try:
            await self.client.create(f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except ApiFailure as exc:  # events are best effort, as on a real cluster
            log.debug("event not recorded: %s", exc)

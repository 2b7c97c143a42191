"""KubeSpawner with group-limited GPU profiles and spawns that fail fast with a reason.

Why a subclass: stock KubeSpawner waits ``start_timeout`` (minutes) for a pod the scheduler can
never place, and the user sees only "timeout". Here a request no node can ever hold (more GPUs
of a type than any node of that type has, per the chart's ``gpuTypes`` inventory) is refused
before a pod exists, and a pod the scheduler keeps refusing (``FailedScheduling``) fails after
``unschedulable_timeout`` seconds with the scheduler's own words. The inventory comes from the
values rather than from listing Nodes because reading Nodes needs cluster-wide RBAC, which the
chart does not grant.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, Dict, Float, Int, List, Unicode

from hub import kueue_wait
from hub.spawn_refused import SpawnRefused

#: Events after which a pending pod may still get a node (cluster autoscaler, preemption).
_HOPEFUL_REASONS = {"TriggeredScaleUp", "Scheduled", "Preempted", "Pulling", "Pulled"}




def largest(gpu_types: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The GPU type with the most GPUs on one node."""
    return max(gpu_types, key=lambda g: int(g["maxPerNode"]), default=None)


def fit_problem(gpus: int, gpu_type: str, gpu_types: list[dict[str, Any]]) -> str | None:
    """Why ``gpus`` GPUs (of ``gpu_type``, or of any type if empty) fit on no node, or None."""
    if gpus <= 0:
        return None
    if gpu_type:
        inv = next((g for g in gpu_types if g["name"] == gpu_type), None)
        if inv is None:
            return f"GPU type {gpu_type!r} is not configured in this cluster"
        if gpus > int(inv["maxPerNode"]):
            return (f"no node has {gpus} × {inv['product']} GPUs; the largest has "
                    f"{inv['maxPerNode']}")
        return None
    best = largest(gpu_types)
    if best is None:
        return f"this cluster has no GPUs configured (gpuTypes); {gpus} requested"
    if gpus > int(best["maxPerNode"]):
        return (f"no node has {gpus} GPUs; the largest has {best['maxPerNode']} "
                f"({best['product']})")
    return None


def unschedulable_reason(events: list[dict[str, Any]]) -> str | None:
    """The scheduler's message if the newest decisive event says the pod cannot be placed.

    Once the cluster autoscaler has promised a node (``TriggeredScaleUp``) there is hope until
    ``start_timeout``, even though the scheduler keeps repeating ``FailedScheduling`` while
    the node boots."""
    if any(e.get("reason") == "TriggeredScaleUp" for e in events):
        return None
    for event in reversed(events):
        reason = event.get("reason")
        if reason == "FailedScheduling":
            return str(event.get("message") or "the scheduler found no node")
        if reason in _HOPEFUL_REASONS:
            return None
    return None


class TunehubKubeSpawner(KubeSpawner):
    """KubeSpawner for tunehub: see the module docstring."""

    profiles = List(
        Dict(),
        help="""All notebook profiles (KubeSpawner profile dicts plus ``slug``, ``gpus``,
        ``gpu_type`` and ``groups``). ``profile_list`` shows each user the ones whose
        ``groups`` include one of theirs (empty ``groups``: everyone; admins: all).""",
    ).tag(config=True)

    gpu_types = List(
        Dict(),
        help="""The cluster's GPU inventory from the chart's ``gpuTypes``: ``name``,
        ``product`` (the ``nvidia.com/gpu.product`` label) and ``maxPerNode``. A request for
        more GPUs than any matching node has is refused at once.""",
    ).tag(config=True)

    unschedulable_timeout = Int(
        90,
        help="""Seconds a pod may stay unschedulable (its newest scheduling event is
        ``FailedScheduling``, with no scale-up or preemption since) before the spawn fails with
        the scheduler's message. 0 waits for ``start_timeout`` as stock KubeSpawner does.""",
    ).tag(config=True)

    data_path = Unicode(
        "",
        help="""Where the hub has the shared data volume mounted (the same path as in
        notebooks). The hub creates each user's writable area there before the first spawn,
        owned by the hub's (= the notebooks') uid, since a subPath the kubelet creates is
        root-owned and unwritable by the non-root notebook.""",
    ).tag(config=True)

    users_subpath = Unicode(
        "users", help="Directory of per-user areas inside the data volume."
    ).tag(config=True)

    create_user_dirs = Bool(
        True, help="Create ``<data_path>/<users_subpath>/<username>`` before a spawn."
    ).tag(config=True)

    kueue_cluster_queue = Unicode(
        "",
        help="""The ClusterQueue behind the notebooks' LocalQueue (``kueue.queueNotebooks``),
        named on the spawn page while a notebook waits for quota.""",
    ).tag(config=True)

    kueue_poll_interval = Float(
        3.0,
        help="""Seconds between two reads of Kueue's queue positions (its visibility API)
        while a queued notebook waits; positions cannot be watched.""",
    ).tag(config=True)

    # --- profiles ----------------------------------------------------------------------------

    @staticmethod
    def visible_profiles(spawner: TunehubKubeSpawner) -> list[dict[str, Any]]:
        """``profile_list`` callable: the profiles this spawner's user may choose."""
        user = spawner.user
        if getattr(user, "admin", False):
            return list(spawner.profiles)
        groups = {g.name for g in getattr(user, "groups", [])}
        visible = [p for p in spawner.profiles if not p.get("groups") or groups & set(p["groups"])]
        if visible and not any(p.get("default") for p in visible):
            visible = [dict(visible[0], default=True), *visible[1:]]
        return visible

    def chosen_profile(self, profiles: list[dict[str, Any]]) -> dict[str, Any]:
        slug = (self.user_options or {}).get("profile")
        if not profiles:
            raise SpawnRefused("no notebook profile is available to you; ask an admin to add "
                               "you to a group", reason="profile")
        if not slug:
            return next((p for p in profiles if p.get("default")), profiles[0])
        for p in profiles:
            if p["slug"] == slug:
                return p
        raise SpawnRefused(f"profile {slug!r} is not available to you; choose one of: "
                           + ", ".join(p["slug"] for p in profiles), reason="profile")

    async def load_user_options(self) -> None:
        profiles = self.visible_profiles(self)
        profile = self.chosen_profile(profiles)
        problem = fit_problem(int(profile.get("gpus") or 0), profile.get("gpu_type") or "",
                              list(self.gpu_types))
        if problem:
            raise SpawnRefused(f"cannot start {profile['display_name']!r}: {problem}")
        await super().load_user_options()
        self._ensure_user_dir()

    def _ensure_user_dir(self) -> None:
        if not (self.create_user_dirs and self.data_path):
            return
        parent = Path(self.data_path) / self.users_subpath
        if not Path(self.data_path).is_dir():
            self.log.warning("data volume not mounted at %s; not creating user areas",
                             self.data_path)
            return
        target = parent / self._expand_user_properties("{username}")
        try:
            target.mkdir(parents=True, exist_ok=True)
            os.chmod(target, 0o2770)
        except OSError as exc:
            # An NFS root owned by root ignores fsGroup: say so instead of a hub error.
            raise SpawnRefused(
                f"cannot create your data area {target}: the hub (uid {os.getuid()}) may not "
                f"write {parent} ({exc.strerror}). An operator must make it writable by uid "
                f"{self.uid} (chart value data.fixPermissions, or chown on the file server)"
            ) from None

    # --- start: fail fast when the scheduler keeps refusing ---------------------------------

    async def _start(self) -> Any:
        start = asyncio.ensure_future(super()._start())
        if not (self.events_enabled and self.unschedulable_timeout):
            return await start
        watch = asyncio.ensure_future(self._watch_unschedulable())
        done, _ = await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
        if start in done:
            watch.cancel()
            return start.result()
        start.cancel()
        # Remove the pending pod now rather than leave it queued behind the refusal.
        await self.stop(now=True)
        raise SpawnRefused(watch.result())

    async def _watch_unschedulable(self) -> str:
        """Return the scheduler's reason once the pod has been unschedulable for
        ``unschedulable_timeout`` seconds in a row; never returns while there is hope."""
        since: float | None = None
        while True:
            reason = unschedulable_reason(self.events)
            if reason is None:
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= self.unschedulable_timeout:
                return (f"no node can take this server ({reason.strip()}); gave up after "
                        f"{self.unschedulable_timeout} s. Choose a smaller profile or try later.")
            await asyncio.sleep(1)

    # --- progress: a queued notebook's place in Kueue's queue -------------------------------

    async def progress(self) -> Any:
        """KubeSpawner's events, and, while the pod waits in Kueue (``kueue.queueNotebooks``),
        its place in the queue whenever it changes."""
        local_queue = (self.extra_labels or {}).get(kueue_wait.QUEUE_LABEL)
        if not local_queue:
            async for event in super().progress():
                yield event
            return
        # (which stream, its next item or None at its end)
        updates: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()

        async def pump(index: int, source: Any) -> None:
            try:
                async for item in source:
                    await updates.put((index, item))
            finally:
                await updates.put((index, None))

        tasks = [asyncio.ensure_future(pump(0, super().progress())),
                 asyncio.ensure_future(pump(1, self._kueue_places(local_queue)))]
        try:
            while True:
                index, item = await updates.get()
                if item is not None:
                    yield item
                elif index == 0:  # KubeSpawner's own stream ended: the spawn is over
                    break
        finally:
            for task in tasks:
                task.cancel()

    async def _kueue_places(self, local_queue: str) -> Any:
        """The pod's place in Kueue's queue while it waits, said when it changes."""
        last = None
        while not (self._start_future and self._start_future.done()):
            try:
                summary = await kueue_wait.pending_workloads(
                    self.api.api_client, self.namespace, local_queue)
            except Exception as exc:  # the place is a nicety: the spawn goes on without it
                self.log.warning("reading Kueue's queue for %s: %s", self.pod_name, exc)
                summary = None
            message = (kueue_wait.queue_message(self.pod_name, summary,
                                                self.kueue_cluster_queue)
                       if summary is not None else None)
            if message and message != last:
                last = message
                yield {"message": message}
            await asyncio.sleep(self.kueue_poll_interval)

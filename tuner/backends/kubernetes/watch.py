"""Keeping one Kubernetes watch alive, apart from what its events mean.

A watch lists its objects, then watches from the list's ``resourceVersion``; when the API
server has compacted that history (410 Gone) or the stream fails, it lists again (after a
back-off) and goes on. Each object, listed or watched, goes to a handler, which is the
backend's (:mod:`.backend`): this module knows nothing of attempts. A handler that raises is
logged and the watch goes on, so one odd object cannot stop every trial's news.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from tuner.backends.kubernetes.api import Kube, describe

log = logging.getLogger("tunehub.backends.kubernetes")

RETRY_SECONDS = 2.0  # back-off before re-listing after a failed watch
QUICK_END_SECONDS = 1.0  # a watch that ended sooner, empty, is started again after this

#: Handles one object; ``True``: it was deleted.
Handler = Callable[[dict[str, Any], bool], Awaitable[None]]
#: Called once the listed objects are handled, with them: what a list shows missing.
Listed = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Watch:
    """One kind of object (``jobs``, ``pods``, ``events``) in one namespace, followed until
    :meth:`run` is cancelled.

    ``before_list`` is called as each list starts and returns what to call with the listed
    objects once they are handled (the backend notes which Jobs it knew of before the list,
    to finish the attempts whose Job is gone from it). ``if_forbidden``: a warning to log when
    the first list is refused (403), the watch then gives up without failing the start;
    without it that refusal, like any failed first list, is :attr:`error`."""

    def __init__(
        self,
        kube: Kube,
        kind: str,
        selectors: tuple[str, str | None],
        handler: Handler,
        before_list: Callable[[], Listed] | None = None,
        if_forbidden: str | None = None,
    ) -> None:
        self.kube, self.kind, self.handler = kube, kind, handler
        self.labels, self.fields = selectors
        self.before_list, self.if_forbidden = before_list, if_forbidden
        self.ready = asyncio.Event()  # the first list is handled, or failed
        self.error = ""  # why the first list failed: the backend's start() reports it

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; list again after 410 Gone or a
        failure. Returns only if the first list fails."""
        while True:
            try:
                listed = self.before_list() if self.before_list else None
                answer = await self.kube.list(self.kind, self.labels, self.fields)
                version = answer["metadata"]["resourceVersion"]
                items = answer.get("items") or []
                for obj in items:
                    await self._handle(obj, False)
                if listed is not None:
                    await listed(items)
                self.ready.set()
                while True:
                    began, events = time.monotonic(), 0
                    async for etype, obj in self.kube.watch(
                        self.kind, self.labels, version, self.fields
                    ):
                        events += 1
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        await self._handle(obj, etype == "DELETED")
                    # Ended: resumed from the last version seen (nothing is missed or seen
                    # twice); one that ended at once, empty (a proxy cutting it), not at once.
                    if not events and time.monotonic() - began < QUICK_END_SECONDS:
                        await asyncio.sleep(QUICK_END_SECONDS)  # backoff, not synchronisation
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep watching, whatever went wrong
                if isinstance(exc, ApiException) and exc.status == 410:
                    continue  # history compacted: list again
                if not self.ready.is_set():
                    forbidden = isinstance(exc, ApiException) and exc.status == 403
                    if forbidden and self.if_forbidden:
                        log.warning("%s: %s", self.if_forbidden, describe(exc))
                    else:
                        self.error = describe(exc)
                    self.ready.set()
                    return
                log.warning("watch of %s failed, listing again: %s", self.kind, describe(exc))
                await asyncio.sleep(RETRY_SECONDS)

    async def _handle(self, obj: dict[str, Any], deleted: bool) -> None:
        try:
            await self.handler(obj, deleted)
        except Exception:
            log.exception("handling %s", obj.get("metadata", {}).get("name"))

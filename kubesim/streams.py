"""The emulator's streaming endpoints: watch (chunked JSON lines, one event per line, as the
API server sends them) and pods/log (plain text, optionally followed)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from . import resources
from .http_errors import ApiError, not_found, status_body
from .objects import JSON
from .resources import Resource
from .selectors import SelectorError, field_matcher, label_matcher
from .store import Store, WatchEvent


def _get_pod(store: Store, namespace: str, name: str) -> JSON:
    pods = resources.lookup("", "v1", "pods")
    assert pods is not None
    pod = store.get(pods, namespace, name)
    if pod is None:
        raise not_found("pods", "", name)
    return copy.deepcopy(pod)


async def serve_log(request: web.Request, store: Store, log_dir: Path, namespace: str,
                    name: str) -> web.StreamResponse:
    """``pods/log``: the captured output, optionally tailed, or followed until the
    container terminates."""
    pods = resources.lookup("", "v1", "pods")
    assert pods is not None
    pod = _get_pod(store, namespace, name)
    names = [c["name"] for c in pod["spec"].get("containers", [])]
    container = request.query.get("container") or (names[0] if len(names) == 1 else None)
    if container is None:
        raise ApiError(400, "BadRequest", f"a container name must be specified for pod "
                                          f"{name}, choose one of: {names}")
    if container not in names + [c["name"] for c in pod["spec"].get("initContainers", [])]:
        raise ApiError(400, "BadRequest", f"container {container} is not valid for pod "
                                          f"{name}")
    path = log_dir / namespace / name / f"{container}.log"
    if not path.exists():
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is '
                                          "waiting to start: ContainerCreating")
    text = path.read_bytes()
    tail = request.query.get("tailLines")
    if tail:
        text = b"".join(text.splitlines(keepends=True)[-int(tail):])
    limit = request.query.get("limitBytes")
    if limit:  # the first limitBytes of what would be returned, as the kubelet does
        text = text[:int(limit)]
    if request.query.get("follow", "").lower() not in ("true", "1"):
        return web.Response(body=text, content_type="text/plain")
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(text)
    offset = path.stat().st_size
    while True:  # follow: stream growth until the container is done or the pod is gone
        current = store.get(pods, namespace, name)
        finished = current is None or _container_done(current, container)
        size = path.stat().st_size
        if size > offset:
            with path.open("rb") as f:
                f.seek(offset)
                await resp.write(f.read(size - offset))
            offset = size
        elif finished:
            return resp
        await asyncio.sleep(0.1)  # poll the log file as the kubelet's log reader does

def _container_done(pod: JSON, container: str) -> bool:
    if pod["status"].get("phase") in ("Succeeded", "Failed"):
        return True
    for s in pod["status"].get("containerStatuses") or []:
        if s["name"] == container:
            return "terminated" in s.get("state", {})
    return False


async def serve_watch(request: web.Request, store: Store, res: Resource, namespace: str | None,
                      stopping: asyncio.Event) -> web.StreamResponse:
    """``?watch=true``: replay (synthetic ADDED for rv 0, history after an rv, 410 when
    compacted), then live events filtered by selectors, until timeoutSeconds or shutdown."""
    q = request.query
    try:
        lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
    except SelectorError as exc:
        raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from None
    rv_param = q.get("resourceVersion") or "0"
    timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
    watcher = store.subscribe(res, namespace)
    try:
        if rv_param == "0":
            replay = [WatchEvent(int(o["metadata"]["resourceVersion"]), res, "ADDED", o, None)
                      for o in store.list(res, namespace)]
        else:
            try:
                found = store.since(res, int(rv_param))
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}"
                               ) from None
            replay = [e for e in found or [] if namespace is None
                      or e.obj["metadata"].get("namespace") == namespace]
            if found is None:
                return await _watch_gone(request, rv_param)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for event in replay:
            await _send(resp, event, lm, fm)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        while not stopping.is_set():
            wait = 1.0 if deadline is None else min(1.0, deadline - loop.time())
            if wait <= 0:
                break
            try:
                event = await asyncio.wait_for(watcher.queue.get(), wait)
            except asyncio.TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    break
                continue
            await _send(resp, event, lm, fm)
        return resp
    finally:
        store.unsubscribe(watcher)


async def _watch_gone(request: web.Request, rv: str) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    message = f"too old resource version: {rv}"
    event = {"type": "ERROR", "object": status_body(410, "Expired", message)}
    await resp.write(json.dumps(event).encode() + b"\n")
    return resp


async def _send(resp: web.StreamResponse, event: WatchEvent, lm: Any, fm: Any) -> None:
    def match(o: JSON | None) -> bool:
        return o is not None and lm(o) and fm(o)

    type_ = event.type
    if type_ == "MODIFIED":
        now_m, was_m = match(event.obj), match(event.old)
        if not now_m and not was_m:
            return
        type_ = "MODIFIED" if now_m and was_m else ("ADDED" if now_m else "DELETED")
    elif not match(event.obj):
        return
    await resp.write(json.dumps({"type": type_, "object": event.obj}).encode() + b"\n")

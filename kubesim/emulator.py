"""A Kubernetes API server emulator served over real HTTP (aiohttp on 127.0.0.1).

Supports discovery, namespaced and cluster-scoped CRUD for the resources in
:mod:`kubesim.resources`, ``/status``, ``pods/log``, ``pods/binding``, label and field
selectors, list + watch with resourceVersion (replay from history, 410 Gone once compacted),
merge / strategic-merge (as merge) / JSON patch, optimistic concurrency (409 Conflict),
``dryRun``, deletion with propagationPolicy, and schema validation of everything stored
(422 Invalid). Requests are counted per (client, verb, resource) in :attr:`Emulator.counters`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from . import kueue_visibility, resources
from .admission import BUILTIN_PRIORITY_CLASSES, Admission, Refused
from .faults import Fault, Faults, InjectedFault, fault_response
from .http_errors import ApiError, error_response, not_found, success
from .immutability import check_update
from .objects import JSON
from .patch import PatchError, apply_patch
from .rbac import Rbac, Request, Unauthorized, forbidden_message
from .resources import Resource
from .selectors import SelectorError, field_matcher, label_matcher
from .store import Counters, Store
from .streams import serve_log, serve_watch
from .validation import K8S_VERSION, Invalid, validate

T = TypeVar("T")
HARNESS_AGENT = "tunehub-kube-harness"
_FAULT = web.RequestKey("kubesim.fault", Fault)  # an applied request's injected answer


class Emulator:
    """The API server. ``start()`` serves it from a background thread with its own event loop;
    :meth:`call` runs coroutines (e.g. the kubelet) on that loop."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.store = Store()
        self.admission = Admission(self.store)
        self.rbac = Rbac(self.store)
        self.counters = Counters()
        #: Faults a test injects into the client's requests (kubesim.faults).
        self.faults = Faults()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        for name, value in BUILTIN_PRIORITY_CLASSES.items():
            self._seed("priorityclasses", "scheduling.k8s.io",
                       {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": name}, "value": value})

    def _seed(self, plural: str, group: str, obj: JSON, namespace: str | None = None) -> None:
        res = resources.lookup(group, "v1", plural)
        assert res is not None
        self.admission.on_create(res, obj, namespace)
        self.store.put(res, obj)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True,
                                        name="kube-emulator")
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("kube emulator did not start within 30s")
        return self.url

    def _serve(self, ready: threading.Event) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start_site())
        ready.set()
        self.loop.run_forever()

    async def _start_site(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the emulator's loop from another thread and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop is None:
            return

        async def _shutdown() -> None:
            assert self._stopping is not None and self._runner is not None
            self._stopping.set()
            await self._runner.cleanup()

        try:
            self.call(_shutdown(), timeout=15)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self._thread:
                self._thread.join(10)

    # -- snapshot helpers for tests (thread-safe through the loop) ----------------------------
    def objects(self, plural: str, namespace: str | None = None, group: str = "",
                version: str = "v1", label_selector: str | None = None) -> list[JSON]:
        res = resources.lookup(group, version, plural)
        if res is None:
            raise KeyError(f"unknown resource {group}/{version}/{plural}")
        match = label_matcher(label_selector)

        async def _list() -> list[JSON]:
            return [copy.deepcopy(o) for o in self.store.list(res, namespace) if match(o)]

        return self.call(_list())

    def compact(self) -> None:
        """Drop the watch history (etcd compaction): older resourceVersions then get 410."""

        async def _compact() -> None:
            self.store.compact()

        self.call(_compact())

    # -- request handling -----------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            response = await self._dispatch(request)
            applied = request.get(_FAULT)
            if applied is not None:  # carried out; its answer is lost
                return fault_response(applied)
            return response
        except InjectedFault as injected:
            return fault_response(injected.fault)
        except ApiError as err:
            return error_response(err)
        except Refused as err:
            return error_response(ApiError(err.code, err.reason, err.message))
        except Unauthorized:
            return error_response(ApiError(401, "Unauthorized", "Unauthorized"))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug in the emulator: still a Status, with the cause
            return error_response(ApiError(500, "InternalError", f"emulator error: {exc!r}"))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        client = "harness" if request.headers.get("User-Agent", "").startswith(
            HARNESS_AGENT) else "client"
        if parts[:2] == ["_emulator", "counters"]:  # GET: counts, DELETE: reset
            if request.method == "DELETE":
                self.counters.reset()
            return web.json_response(self.counters.as_json())
        user = self.rbac.authenticate(request.headers.get("Authorization"))
        simple = self._discovery(parts)
        if simple is not None:
            if not self.rbac.allows_path(user, request.path):
                raise ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot '
                                                 f'{request.method.lower()} path '
                                                 f'"{request.path}"')
            return web.json_response(simple)
        if parts[:3] == ["apis", kueue_visibility.GROUP, kueue_visibility.VERSION]:
            return self._visibility(user, client, parts[3:], request.method)
        if parts[:1] == ["api"] and len(parts) >= 3 and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace: str | None = None
        if (rest[0] == "namespaces" and len(rest) >= 3
                and resources.lookup(group, version, rest[2]) is not None):
            namespace, rest = rest[1], rest[2:]
        res = resources.lookup(group, version, rest[0])
        if res is None or len(rest) > 3 or (res.namespaced and namespace is None
                                            and len(rest) > 1) or (
                not res.namespaced and namespace is not None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status", "log", "binding") or (
                sub == "status" and not res.has_status) or (
                sub in ("log", "binding") and res.plural != "pods"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        method = request.method
        verb = {"GET": "get" if name else ("watch" if q.get("watch", "").lower() in ("true", "1")
                                           else "list"),
                "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method)
        if verb is None or (method == "POST" and name and sub != "binding") or (
                method in ("PUT", "PATCH") and not name) or (
                method == "POST" and res.namespaced and namespace is None):
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
        attrs = Request("watch" if name and verb == "get" and q.get("watch", "").lower() in (
            "true", "1") else verb, res.group, res.plural, sub or "", namespace or "",
            name or "")
        if not self.rbac.authorize(user, attrs):
            raise ApiError(403, "Forbidden", forbidden_message(user, attrs),
                           {"name": name or "", "group": res.group, "kind": res.plural}
                           if name else {"group": res.group, "kind": res.plural})
        self.counters.add(client, verb, res.plural + (f"/{sub}" if sub else ""))
        fault = (self.faults.take(verb, res.plural + (f"/{sub}" if sub else ""))
                 if client == "client" else None)
        if fault is not None:
            early = await self._inject(fault, request, verb)
            if early is not None:
                return early
        if verb == "watch":
            assert self._stopping is not None
            return await serve_watch(request, self.store, res, namespace, self._stopping)
        if verb == "list":
            return web.json_response(self._list(res, namespace, q))
        if sub == "log":
            return await serve_log(request, self.store, self.log_dir, namespace or "", name or "")
        body = await self._body(request) if method in ("POST", "PUT", "PATCH") else None
        if sub == "binding":
            return web.json_response(self._bind(namespace or "", name or "", body), status=201)
        if verb == "get":
            return web.json_response(self._get(res, namespace, name or ""))
        if verb == "create":
            obj = self._create(res, namespace, body, dry_run="dryRun" in q)
            response = web.json_response(obj, status=201)
            for w in self.admission.warnings:
                response.headers.add("Warning", '299 - "' + w.replace('"', '\\"') + '"')
            self._after_write(res, namespace)
            return response
        if verb == "update":
            updated = self._update(res, namespace, name or "", body, sub, q)
            self._after_write(res, namespace)
            return web.json_response(updated)
        if verb == "patch":
            old = self._get(res, namespace, name or "")
            try:
                patched = apply_patch(request.content_type, old, body)
            except PatchError as exc:
                if "content type" in str(exc):
                    raise ApiError(415, "UnsupportedMediaType", str(exc)) from None
                raise ApiError(422, "Invalid", str(exc)) from None
            updated = self._update(res, namespace, name or "", patched, sub, q)
            self._after_write(res, namespace)
            return web.json_response(updated)
        delete_opts = (await self._body(request, optional=True)) or {}
        if q.get("gracePeriodSeconds") is not None:
            delete_opts["gracePeriodSeconds"] = q["gracePeriodSeconds"]
        propagation = q.get("propagationPolicy") or delete_opts.get("propagationPolicy")
        if delete_opts.get("orphanDependents") is True:
            propagation = "Orphan"
        if verb == "delete":
            gone = self._delete(res, namespace, name or "", propagation, delete_opts)
            self._after_write(res, namespace)
            return web.json_response(gone)
        items = self._list(res, namespace, q)["items"]
        for item in items:
            self.admission.delete(res, item, propagation)
        self.admission.settle()
        self._after_write(res, namespace)
        return web.json_response({"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                  "metadata": {}, "items": items})

    def _visibility(self, user: Any, client: str, rest: list[str], method: str
                    ) -> web.StreamResponse:
        """Kueue's visibility API (:mod:`.kueue_visibility`), authorized like any request:
        ``get`` on ``localqueues/pendingworkloads`` (or ``clusterqueues/...``)."""
        if len(rest) == 5 and rest[0] == "namespaces" and rest[2] == "localqueues" \
                and rest[4] == "pendingworkloads":
            namespace, resource, name = rest[1], "localqueues", rest[3]
        elif len(rest) == 3 and rest[0] == "clusterqueues" and rest[2] == "pendingworkloads":
            namespace, resource, name = "", "clusterqueues", rest[1]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
        attrs = Request("get", kueue_visibility.GROUP, resource, "pendingworkloads",
                        namespace, name)
        if not self.rbac.authorize(user, attrs):
            raise ApiError(403, "Forbidden", forbidden_message(user, attrs),
                           {"name": name, "group": kueue_visibility.GROUP, "kind": resource})
        self.counters.add(client, "get", f"{resource}/pendingworkloads")
        summary = (kueue_visibility.local_queue_pending(self.store, namespace, name)
                   if namespace else kueue_visibility.cluster_queue_pending(self.store, name))
        if summary is None:
            raise ApiError(404, "NotFound", f'{resource}.kueue.x-k8s.io "{name}" not found',
                           {"name": name, "group": "kueue.x-k8s.io", "kind": resource})
        return web.json_response(summary)

    @staticmethod
    async def _inject(fault: Fault, request: web.Request,
                      verb: str) -> web.StreamResponse | None:
        """A test's fault (:mod:`kubesim.faults`): wait, then answer the error now, or after
        carrying the request out, or end a watch at once; None: go on serving it."""
        if fault.delay:
            await asyncio.sleep(fault.delay)  # the injected slow answer
        fault.waited += 1
        if fault.status and not fault.applied:
            raise InjectedFault(fault)
        if fault.applied:
            request[_FAULT] = fault
        elif verb == "watch":
            return web.Response(status=200, content_type="application/json", body=b"")
        return None

    def _after_write(self, res: Resource, namespace: str | None) -> None:
        """The quota controller's part: usage changes with pods and Jobs (and new quotas)."""
        if namespace and res.plural in ("pods", "jobs", "resourcequotas"):
            self.admission.quotas.refresh(namespace)

    @staticmethod
    def _discovery(parts: list[str]) -> JSON | None:
        if not parts:
            return {"paths": ["/api", "/api/v1", "/apis", "/version", "/healthz"]}
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return {"status": "ok"}
        if parts == ["version"]:
            major, minor = K8S_VERSION.split(".")
            return {"major": major, "minor": minor, "gitVersion": f"v{K8S_VERSION}.0",
                    "platform": "linux/amd64", "goVersion": "go1.22", "compiler": "gc",
                    "gitCommit": "tunehub-kube-emulator", "gitTreeState": "clean",
                    "buildDate": "2024-01-01T00:00:00Z"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if parts == ["api", "v1"]:
            return resources.resource_list("", "v1")
        if parts == ["apis"]:
            return resources.api_group_list()
        if len(parts) == 2 and parts[0] == "apis":
            if parts[1] not in resources.group_versions():
                raise ApiError(404, "NotFound", "the server could not find the requested "
                                                "resource")
            return resources.api_group(parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            found = resources.resource_list(parts[1], parts[2])
            if found is None:
                raise ApiError(404, "NotFound", "the server could not find the requested "
                                                "resource")
            return found
        return None

    @staticmethod
    async def _body(request: web.Request, optional: bool = False) -> Any:
        raw = await request.read()
        if not raw:
            if optional:
                return None
            raise ApiError(400, "BadRequest", "the request body is empty")
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "the request body is not valid JSON") from None

    # -- verbs ---------------------------------------------------------------------------------
    def _get(self, res: Resource, namespace: str | None, name: str) -> JSON:
        obj = self.store.get(res, namespace or "", name)
        if obj is None:
            raise not_found(res.plural, res.group, name)
        return copy.deepcopy(obj)

    def _list(self, res: Resource, namespace: str | None, q: Any) -> JSON:
        try:
            lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from None
        items = [copy.deepcopy(o) for o in self.store.list(res, namespace) if lm(o) and fm(o)]
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}

    def _check(self, res: Resource, obj: JSON) -> None:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        if obj.get("apiVersion") != res.api_version or obj.get("kind") != res.kind:
            raise ApiError(400, "BadRequest",
                           f"the body is apiVersion={obj.get('apiVersion')!r} "
                           f"kind={obj.get('kind')!r}, expected {res.api_version} {res.kind}")
        try:
            validate(obj)
        except Invalid as exc:
            raise self._invalid(res, (obj.get("metadata") or {}).get("name", ""), exc) from None

    @staticmethod
    def _invalid(res: Resource, name: str, exc: Invalid) -> ApiError:
        return ApiError(422, "Invalid", f'{res.qualified} "{name}" is invalid: {exc}', {
            "name": name, "group": res.group, "kind": res.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": exc.message,
                        "field": exc.field}]})

    def _create(self, res: Resource, namespace: str | None, body: Any,
                dry_run: bool = False) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        obj = copy.deepcopy(body)
        self.admission.on_create(res, obj, namespace)
        self._check(res, obj)
        meta = obj["metadata"]
        if self.store.get(res, meta.get("namespace", ""), meta["name"]) is not None:
            raise ApiError(409, "AlreadyExists",
                           f'{res.plural}{"." + res.group if res.group else ""} '
                           f'"{meta["name"]}" already exists',
                           {"name": meta["name"], "group": res.group, "kind": res.plural})
        if dry_run:
            return obj
        self.store.put(res, obj)
        self.admission.after_create(res, obj)
        return copy.deepcopy(obj)

    def _update(self, res: Resource, namespace: str | None, name: str, body: Any,
                sub: str | None, q: Any) -> JSON:
        old = self._get(res, namespace, name)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        body_meta = body.get("metadata") or {}
        if body_meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the "
                                              "name on the URL")
        rv = body_meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {res.plural} "{name}": the '
                           "object has been modified; please apply your changes to the "
                           "latest version and try again",
                           {"name": name, "group": res.group, "kind": res.plural})
        merged = self.admission.on_update(res, old, body, sub)
        if sub is None:
            try:
                check_update(res.plural, old, merged)
            except Invalid as exc:
                raise self._invalid(res, name, exc) from None
        self._check(res, merged)
        if "dryRun" in q:
            return merged
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if merged == old:
            return old  # no-op writes do not bump resourceVersion, as on a real server
        self.store.put(res, merged)
        return copy.deepcopy(merged)

    def _delete(self, res: Resource, namespace: str | None, name: str,
                propagation: str | None, opts: JSON) -> JSON:
        obj = self._get(res, namespace, name)
        pre = opts.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if pre.get(key) and pre[key] != obj["metadata"].get(key):
                raise ApiError(409, "Conflict", f"Precondition failed: {key} in precondition: "
                                                f"{pre[key]}, {key} in object meta: "
                                                f"{obj['metadata'].get(key)}")
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(400, "BadRequest", f"unsupported propagationPolicy {propagation!r}")
        grace = opts.get("gracePeriodSeconds")
        gone = self.admission.delete(res, obj, propagation,
                                     None if grace is None else int(grace))
        self.admission.settle()
        if res.plural == "pods":
            return copy.deepcopy(gone)
        return success(res.plural, res.group, name, obj["metadata"].get("uid"))

    def _bind(self, namespace: str, name: str, body: Any) -> JSON:
        pods = resources.lookup("", "v1", "pods")
        assert pods is not None
        pod = self._get(pods, namespace, name)
        node = ((body or {}).get("target") or {}).get("name")
        if not node:
            raise ApiError(422, "Invalid", "target.name: Required value")
        if pod["spec"].get("nodeName"):
            raise ApiError(409, "Conflict", f'pod {name} is already assigned to node '
                                            f'"{pod["spec"]["nodeName"]}"')
        pod["spec"]["nodeName"] = node
        conds = [c for c in pod["status"].get("conditions", []) if c["type"] != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": _now()})
        pod["status"]["conditions"] = conds
        self.store.put(pods, pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

def _now() -> str:
    from .admission import now

    return now()

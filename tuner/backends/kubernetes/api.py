"""A thin layer over kubernetes-asyncio that speaks the API's JSON (plain dicts), so the
manifests and status rules stay plain data, and that turns API errors into one readable line.

An API server has bad moments (an upgrade, a failover, overload): 429, 500, 502, 503 and 504
answers and refused or dropped connections are tried again with backoff (the server's
``Retry-After`` when it gives one) for up to :data:`API_PATIENCE` seconds, so a blink fails no
attempt. A create whose answer was lost after it was applied is answered 409 when tried again:
the object is then ours, never made twice.
"""

from __future__ import annotations

import asyncio
import builtins  # `list` names a method of a class below: its annotations say builtins.list
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tunehub_base.gpu_names import GpuNames
from tuner.backends.kubernetes import kueue
from tuner.backends.kubernetes.settings import KubeSettings
from tuner.errors import TunehubError

log = logging.getLogger("tunehub.backends.kubernetes")
T = TypeVar("T")

#: Answers that mean "the server cannot answer now; the same request may work in a moment".
TRANSIENT = frozenset({429, 500, 502, 503, 504})
#: How long one call is tried again through transient failures before they count.
API_PATIENCE = 60.0
#: How long one request may take before it is given up on and tried again (a watch has its
#: own): without it, a server that accepted the connection and never answered would hold the
#: backend forever.
REQUEST_SECONDS = 30.0
_FIRST_DELAY, _MAX_DELAY = 0.5, 8.0
WATCH_SECONDS = 300  # server-side timeout of one watch request; the watch then resumes
#: The most of one pod's output the tuner reads into memory for the trial's log.
POD_LOG_BYTES = 16 * 2**20


class ClusterUnavailable(TunehubError):
    """The Kubernetes API cannot be reached or configured: a one-line reason for the user."""

    status = 503


def describe(exc: BaseException) -> str:
    """One line for any failure talking to the API (HTTP error, refused connection...)."""
    if isinstance(exc, ApiException):
        return api_message(exc)
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def api_message(exc: ApiException) -> str:
    """The API server's ``Status.message`` (e.g. the 422 field errors), else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except (TypeError, ValueError):
        pass
    return f"{exc.status} {exc.reason}".strip()


def transient(exc: BaseException) -> bool:
    """A failure worth trying again: a transient status, or the connection refused, dropped
    or timed out."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT
    return isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                            asyncio.TimeoutError))


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    try:
        return min(float(headers.get("Retry-After", "")), _MAX_DELAY * 4)
    except (TypeError, ValueError):
        return None


async def patiently(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again with backoff while it fails transiently (:func:`transient`),
    for up to :data:`API_PATIENCE` seconds; then, or for any other failure, raised."""
    deadline = time.monotonic() + API_PATIENCE
    delay = _FIRST_DELAY
    while True:
        try:
            return await call()
        except Exception as exc:
            if not transient(exc) or time.monotonic() > deadline:
                raise
            wait = _retry_after(exc) or delay
            log.warning("%s: %s; trying again in %.1f s", what, describe(exc), wait)
            await asyncio.sleep(wait)  # backoff between retries of a failed API call
            delay = min(delay * 2, _MAX_DELAY)


async def connect(settings: KubeSettings) -> client.ApiClient:
    """The kubeconfig (``KUBECONFIG`` or ``~/.kube/config``) when there is one, else the
    in-cluster service account."""
    cfg = client.Configuration()
    kubeconfig = settings.kubeconfig or str(Path.home() / ".kube" / "config")
    if settings.kubeconfig and not Path(kubeconfig).is_file():
        raise ClusterUnavailable(f"KUBECONFIG: {kubeconfig} does not exist")
    try:
        if settings.kubeconfig or Path(kubeconfig).exists():
            await config.load_kube_config(
                config_file=kubeconfig, context=settings.context, client_configuration=cfg
            )
        else:
            config.load_incluster_config(client_configuration=cfg)
    except Exception as exc:  # ConfigException, OSError, YAML errors: all mean "no cluster"
        raise ClusterUnavailable(
            f"no Kubernetes configuration ({describe(exc)}); set KUBECONFIG or run in a pod"
        ) from None
    api = client.ApiClient(cfg)
    api.user_agent = "tunehub-tuner"
    return api


def _warning_text(header: str) -> str:
    """The text of an HTTP ``Warning: 299 - "text"`` header (RFC 7234 quoting undone)."""
    _, _, rest = header.partition(" ")  # the code (299)
    _, _, text = rest.partition(" ")  # the agent ("-")
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text or header


class Kube:
    """The calls the backend makes, in one namespace, returning the API's JSON."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    async def close(self) -> None:
        await self.api.close()

    @staticmethod
    async def _json(call: Any, warnings: list[str] | None = None) -> dict[str, Any]:
        """Run a ``_preload_content=False`` call: the JSON body, or :class:`ApiException`
        for an error status (the client only raises by itself when it parses the body).
        The server's ``Warning`` headers are added to ``warnings`` if given."""
        resp = await call
        try:
            body = await resp.read()
            if warnings is not None:
                warnings += [_warning_text(w) for w in resp.headers.getall("Warning", [])]
        finally:
            resp.release()
        if resp.status >= 400:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = body.decode(errors="replace")
            exc.headers = resp.headers  # (Retry-After)
            raise exc
        return dict(json.loads(body))

    # --- Jobs and their dependents ------------------------------------------------------

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj``, through transient failures (:func:`patiently`). A 409 on a second
        try means the first was applied and its answer lost: the object is ours (a Job is read
        back, for its uid); a 409 on the first try is the caller's to judge (a Job of an
        earlier tuner)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        tries = 0

        async def once() -> dict[str, Any]:
            nonlocal tries
            tries += 1
            try:
                return await self._create(obj)
            except ApiException as exc:
                if exc.status != 409 or tries == 1:
                    raise
                if kind != "Job":
                    return obj
                existing = await self.get_job(name)
                if existing is None:
                    raise
                return existing

        return await patiently(f"creating {kind} {name}", once)

    async def _create(self, obj: dict[str, Any]) -> dict[str, Any]:
        # The client's annotations ask for its model classes (V1Job, ...); its serializer sends
        # a plain manifest dict as it is, which is what we build (manifests.py).
        kwargs: dict[str, Any] = {"_preload_content": False,
                                  "_request_timeout": REQUEST_SECONDS}
        kind = obj["kind"]
        if kind == "Job":
            return await self._json(
                self.batch.create_namespaced_job(self.ns, obj, **kwargs))  # type: ignore[arg-type]
        if kind == "Secret":
            return await self._json(
                self.core.create_namespaced_secret(self.ns, obj, **kwargs))  # type: ignore[arg-type]
        if kind == "Service":
            return await self._json(
                self.core.create_namespaced_service(self.ns, obj, **kwargs))  # type: ignore[arg-type]
        if kind == "NetworkPolicy":
            return await self._json(self.networking.create_namespaced_network_policy(
                self.ns, obj, **kwargs))  # type: ignore[arg-type]
        raise ValueError(f"unsupported kind {kind}")

    async def dry_run_warnings(self, obj: dict[str, Any]) -> list[str]:
        """Create Job ``obj`` as a server-side dry run (nothing is stored; an invalid Job
        raises :class:`ApiException`) and return the server's ``Warning`` headers, e.g. that
        its pods would violate the namespace's Pod Security level."""
        async def once() -> list[str]:
            warnings: list[str] = []
            await self._json(
                self.batch.create_namespaced_job(  # a dict, as in create
                    self.ns, obj, dry_run="All", _preload_content=False,  # type: ignore[arg-type]
                    _request_timeout=REQUEST_SECONDS),
                warnings,
            )
            return warnings

        return await patiently("checking the Job (dry run)", once)

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            return await patiently(f"reading Job {name}", lambda: self._json(
                self.batch.read_namespaced_job(name, self.ns, _preload_content=False,
                                              _request_timeout=REQUEST_SECONDS)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete_job(self, name: str) -> bool:
        """Delete with Background propagation (pods, Secret, Service follow); False if gone."""
        try:
            await patiently(f"deleting Job {name}", lambda: self._json(
                self.batch.delete_namespaced_job(
                    name, self.ns, propagation_policy="Background", _preload_content=False,
                    _request_timeout=REQUEST_SECONDS,
                )
            ))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def _lister(self, kind: str) -> Any:
        return {
            "jobs": self.batch.list_namespaced_job,
            "pods": self.core.list_namespaced_pod,
            "events": self.core.list_namespaced_event,
            "workloads": self._list_workloads,
        }[kind]

    def _list_workloads(self, namespace: str, **kwargs: Any) -> Any:
        """Kueue's Workloads, called as the core listers are (namespace first)."""
        return self.custom.list_namespaced_custom_object(
            kueue.API_GROUP, kueue.API_VERSION, namespace, "workloads", **kwargs)

    async def pending_workloads(self, local_queue: str) -> dict[str, Any] | None:
        """Kueue's visibility API: the LocalQueue's pending workloads with their positions
        (``PendingWorkloadsSummary``); None when it is not served or not allowed."""
        path = (f"/apis/{kueue.VISIBILITY_GROUP}/{kueue.VISIBILITY_VERSION}/namespaces/"
                "{namespace}/localqueues/{name}/pendingworkloads")
        try:
            return await self._json(self.api.call_api(
                path, "GET", {"namespace": self.ns, "name": local_queue},
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                _return_http_data_only=True, _preload_content=False))
        except ApiException as exc:
            if exc.status in (401, 403, 404, 503):
                return None
            raise

    async def cluster_queue(self, name: str) -> dict[str, Any]:
        """Kueue's ClusterQueue ``name``: its quota per flavor and, in its status, what is in
        use (the pool view's flavors). Cluster-scoped: the chart's ClusterRole grants ``get``
        on this one name."""
        return await patiently(f"reading ClusterQueue {name}", lambda: self._json(
            self.custom.get_cluster_custom_object(
                kueue.API_GROUP, kueue.API_VERSION, "clusterqueues", name,
                _preload_content=False, _request_timeout=REQUEST_SECONDS)))

    @staticmethod
    def _selectors(selector: str, fields: str | None) -> dict[str, str]:
        out = {"label_selector": selector} if selector else {}
        if fields:
            out["field_selector"] = fields
        return out

    async def list(self, kind: str, selector: str, fields: str | None = None) -> dict[str, Any]:
        """Jobs, pods or events of the namespace matching a label (and field) selector."""
        return await patiently(f"listing {kind}", lambda: self._json(
            self._lister(kind)(
                self.ns, **self._selectors(selector, fields), _preload_content=False,
                _request_timeout=REQUEST_SECONDS,
            )
        ))

    async def watch(
        self, kind: str, selector: str, resource_version: str, fields: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One watch request from ``resource_version``; ends after :data:`WATCH_SECONDS`.
        A 410 Gone (history compacted) raises :class:`ApiException` for the caller to re-list.
        """
        w = watch.Watch(return_type="object")  # keep the JSON: no model objects per event
        try:
            async for event in w.stream(
                self._lister(kind),
                self.ns,
                **self._selectors(selector, fields),
                resource_version=resource_version,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + 30,  # a silently dead connection ends too
            ):
                yield event["type"], event["raw_object"]
        finally:
            await w.close()

    async def pod_log(self, name: str, limit: int = POD_LOG_BYTES) -> str | None:
        """The pod's output through the API server (``pods/log``), never through a file: the
        first ``limit`` bytes of it."""
        try:
            return str(await self.core.read_namespaced_pod_log(
                name, self.ns, limit_bytes=limit))
        except ApiException:
            return None

    # --- what check() reads -------------------------------------------------------------

    async def node_gpus(self, names: GpuNames) -> builtins.list[tuple[str, int]] | None:
        """``(gpu product label, allocatable GPUs)`` per node, by the cluster's GPU ``names``;
        None if the tuner may not list Nodes (a namespaced Role)."""
        try:
            nodes = await self._json(self.core.list_node(_preload_content=False))
        except ApiException as exc:
            if exc.status in (401, 403):
                return None
            raise
        out = []
        for node in nodes.get("items") or []:
            status = node.get("status") or {}
            alloc = (status.get("allocatable") or status.get("capacity") or {}).get(
                names.resource, "0"
            )
            product = (node.get("metadata") or {}).get("labels", {}).get(
                names.product_label, ""
            )
            try:
                out.append((product, int(str(alloc))))
            except ValueError:
                out.append((product, 0))
        return out

    async def priority_class_exists(self, name: str) -> bool | None:
        """None when the tuner may not read PriorityClasses."""
        try:
            await self._json(self.scheduling.read_priority_class(name, _preload_content=False))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status in (401, 403):
                return None
            raise

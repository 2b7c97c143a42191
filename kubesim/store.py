"""The emulator's object store: one resourceVersion counter for everything (like etcd's
revision), a bounded event history for watch resumption, live watcher queues, and request
counters. It lives on the emulator's event loop; nothing here does I/O."""

from __future__ import annotations

import asyncio
import builtins
import copy
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from .objects import JSON
from .resources import Resource

#: How many events are kept for watches that resume from an older resourceVersion.
HISTORY = 20000

Key = tuple[str, str, str]  # (resource plural key, namespace or "", name)

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@dataclass
class WatchEvent:
    """One change: the type, the object after (or at deletion), the object before."""

    rv: int
    resource: Resource
    type: str
    obj: JSON
    old: JSON | None


@dataclass
class Watcher:
    resource: Resource
    namespace: str | None
    queue: asyncio.Queue[WatchEvent] = field(default_factory=asyncio.Queue)


class Counters:
    """Request counts per (client, verb, resource). ``client`` is ``harness`` for the kubelet
    and controllers of this package and ``client`` for everything else, so benchmarks count
    only the requests the code under test makes. Thread-safe: tests read it from another
    thread than the one serving requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, client: str, verb: str, resource: str) -> None:
        with self._lock:
            self._counts[(client, verb, resource)] += 1

    def snapshot(self, client: str = "client") -> dict[tuple[str, str], int]:
        """``{(verb, resource): count}`` for one client class."""
        with self._lock:
            return {(v, r): n for (c, v, r), n in self._counts.items() if c == client}

    def writes(self, client: str = "client", resource: str | None = None) -> int:
        return sum(n for (v, r), n in self.snapshot(client).items()
                   if v in WRITE_VERBS and (resource is None or r == resource))

    def reads(self, client: str = "client", resource: str | None = None) -> int:
        return sum(n for (v, r), n in self.snapshot(client).items()
                   if v not in WRITE_VERBS and (resource is None or r == resource))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def as_json(self) -> JSON:
        with self._lock:
            out: JSON = {}
            for (c, v, r), n in sorted(self._counts.items()):
                out.setdefault(c, {}).setdefault(r, {})[v] = n
            return out


class Store:
    """Objects by key, the global revision, history and watchers."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], JSON]] = {}
        self.rv = 1
        self.history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self.compacted_rv = 1  # watches from an rv older than this get 410 Gone
        self.watchers: list[Watcher] = []

    @staticmethod
    def rkey(resource: Resource) -> str:
        return f"{resource.group}/{resource.plural}"

    def table(self, resource: Resource) -> dict[tuple[str, str], JSON]:
        return self.objects.setdefault(self.rkey(resource), {})

    def get(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        return self.table(resource).get((namespace, name))

    def list(self, resource: Resource, namespace: str | None) -> list[JSON]:
        items = [o for (ns, _), o in self.table(resource).items()
                 if namespace is None or ns == namespace]
        return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""),
                                            o["metadata"]["name"]))

    def _emit(self, resource: Resource, type_: str, obj: JSON, old: JSON | None) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        event = WatchEvent(self.rv, resource, type_, copy.deepcopy(obj), old)
        self.history.append(event)
        for w in self.watchers:
            if w.resource == resource and (w.namespace is None
                                           or w.namespace == obj["metadata"].get("namespace")):
                w.queue.put_nowait(event)

    def put(self, resource: Resource, obj: JSON) -> JSON:
        """Insert or replace ``obj``; bumps and stamps the resourceVersion, emits an event."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self.table(resource).get(key)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.table(resource)[key] = obj
        self._emit(resource, "MODIFIED" if old else "ADDED", obj, old)
        return obj

    def remove(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        obj = self.table(resource).pop((namespace, name), None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._emit(resource, "DELETED", obj, obj)
        return obj

    def compact(self) -> None:
        """Forget all history, as etcd compaction does: older watches then get 410 Gone."""
        self.history.clear()
        self.compacted_rv = self.rv

    def since(self, resource: Resource, rv: int) -> builtins.list[WatchEvent] | None:
        """Events for ``resource`` newer than ``rv``, or None if ``rv`` is compacted away."""
        if rv < self.compacted_rv:
            return None
        return [e for e in self.history if e.rv > rv and e.resource == resource]

    def subscribe(self, resource: Resource, namespace: str | None) -> Watcher:
        watcher = Watcher(resource, namespace)
        self.watchers.append(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)

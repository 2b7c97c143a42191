"""LimitRange and ResourceQuota admission, and the quota controller's ``status.used``.

Why: a namespace quota is how a shared cluster says "not now"; a real API server refuses the
pod (``pods "x" is forbidden: exceeded quota: compute, requested: requests.cpu=2, used:
requests.cpu=7, limited: requests.cpu=8``) and a Job controller keeps retrying, so our code
must show that wait instead of failing or hanging silently.

- LimitRange (type Container): ``default`` / ``defaultRequest`` fill missing limits/requests,
  ``max`` / ``min`` refuse (``maximum cpu usage per Container is 2, but limit is 4``).
- ResourceQuota ``spec.hard``: ``pods``, ``count/pods``, ``count/jobs.batch``, ``cpu`` /
  ``memory`` / ``requests.X`` (pod requests, any resource such as ``requests.nvidia.com/gpu``)
  and ``limits.X``; pods in phase Succeeded/Failed do not count. A quota on cpu or memory
  refuses pods that do not say how much (``failed quota: q: must specify requests.cpu for:
  c``). ``status.hard`` / ``status.used`` follow every change of pods and Jobs.

Not emulated: quota scopes and scopeSelector (PriorityClass, BestEffort, Terminating), object
counts other than pods and Jobs, storage quotas, LimitRange types Pod and
PersistentVolumeClaim, ``maxLimitRequestRatio``.
"""

from __future__ import annotations

from decimal import Decimal

from .objects import JSON
from .resources import lookup
from .store import Store
from .validation import parse_quantity

TERMINAL = ("Succeeded", "Failed")
COMPUTE = ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory")


def format_quantity(name: str, value: Decimal) -> str:
    """A canonical-looking quantity: ``500m`` / ``2`` for CPU, ``1Gi`` or bytes for memory."""
    base = name.rsplit(".", 1)[-1] if name.startswith(("requests.", "limits.")) else name
    if base == "cpu":
        return str(int(value)) if value == int(value) else f"{int(value * 1000)}m"
    if value == int(value) and base in ("memory", "ephemeral-storage", "storage"):
        for suffix, factor in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30),
                               ("Mi", 2**20), ("Ki", 2**10)):
            if value and value % factor == 0:
                return f"{int(value // factor)}{suffix}"
    return str(int(value)) if value == int(value) else str(value)


def _resource_list(container: JSON, kind: str) -> dict[str, Decimal]:
    values = ((container.get("resources") or {}).get(kind) or {})
    return {k: parse_quantity(v) for k, v in values.items()}


def pod_usage(spec: JSON) -> dict[str, Decimal]:
    """What one pod charges against a quota: ``requests.X``/``limits.X`` (the sum over its
    containers, at least the largest init container) plus ``pods``/``count/pods``."""
    usage: dict[str, Decimal] = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for kind in ("requests", "limits"):
        total: dict[str, Decimal] = {}
        for c in spec.get("containers") or []:
            for k, v in _resource_list(c, kind).items():
                total[k] = total.get(k, Decimal(0)) + v
        for c in spec.get("initContainers") or []:
            for k, v in _resource_list(c, kind).items():
                total[k] = max(total.get(k, Decimal(0)), v)
        for k, v in total.items():
            usage[f"{kind}.{k}"] = v
            if kind == "requests" and k in ("cpu", "memory", "ephemeral-storage"):
                usage[k] = v
    return usage


class Quotas:
    """LimitRange mutation/validation and ResourceQuota admission over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _list(self, plural: str, namespace: str, group: str = "") -> list[JSON]:
        res = lookup(group, "v1", plural)
        assert res is not None
        return self.store.list(res, namespace)

    # -- LimitRange --------------------------------------------------------------------------
    def limit_range(self, pod: JSON) -> list[str]:
        """Apply defaults of the namespace's LimitRanges to ``pod``; the violations of their
        min/max (empty: admitted)."""
        errors: list[str] = []
        spec = pod.get("spec") or {}
        for lr in self._list("limitranges", pod["metadata"]["namespace"]):
            for item in (lr.get("spec") or {}).get("limits") or []:
                if item.get("type") != "Container":
                    continue
                # the LimitRange's own defaulting: default <- max, defaultRequest <- default
                # then min, per resource
                default = {**(item.get("max") or {}), **(item.get("default") or {})}
                default_request = {**(item.get("min") or {}), **default,
                                   **(item.get("defaultRequest") or {})}
                for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                    res = c.setdefault("resources", {})
                    limits = res.setdefault("limits", {})
                    requests = res.setdefault("requests", {})
                    for k, v in default.items():
                        limits.setdefault(k, v)
                    for k, v in default_request.items():
                        requests.setdefault(k, v)
                    for key in ("limits", "requests"):
                        if not res[key]:
                            del res[key]
                    errors += _min_max(item, res.get("requests") or {}, res.get("limits") or {})
        return errors

    # -- ResourceQuota -----------------------------------------------------------------------
    def used(self, namespace: str, hard: JSON) -> dict[str, Decimal]:
        used = {k: Decimal(0) for k in hard}
        for pod in self._list("pods", namespace):
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            for k, v in pod_usage(pod.get("spec") or {}).items():
                if k in used:
                    used[k] += v
        if "count/jobs.batch" in used:
            used["count/jobs.batch"] = Decimal(len(self._list("jobs", namespace, "batch")))
        return used

    def admit(self, kind: str, obj: JSON) -> str | None:
        """Why the namespace's quotas refuse creating ``obj`` (a Pod or Job), or None."""
        namespace = obj["metadata"]["namespace"]
        if kind == "Pod":
            requested = pod_usage(obj.get("spec") or {})
        else:
            requested = {"count/jobs.batch": Decimal(1)}
        for quota in self._list("resourcequotas", namespace):
            name = quota["metadata"]["name"]
            hard = {k: parse_quantity(v) for k, v in ((quota.get("spec") or {}).get("hard")
                                                       or {}).items()}
            if kind == "Pod":
                missing = _unspecified(obj.get("spec") or {}, hard)
                if missing:
                    return f"failed quota: {name}: must specify {missing}"
            used = self.used(namespace, hard)
            over = sorted(k for k, v in requested.items()
                          if k in hard and used[k] + v > hard[k])
            if over:
                return (f"exceeded quota: {name}, requested: {_show(over, requested)}, "
                        f"used: {_show(over, used)}, limited: {_show(over, hard)}")
        return None

    def refresh(self, namespace: str) -> None:
        """The quota controller: keep ``status.hard``/``status.used`` current."""
        res = lookup("", "v1", "resourcequotas")
        assert res is not None
        for quota in self.store.list(res, namespace):
            hard_spec = (quota.get("spec") or {}).get("hard") or {}
            hard = {k: parse_quantity(v) for k, v in hard_spec.items()}
            used = self.used(namespace, hard)
            status = {"hard": dict(hard_spec),
                      "used": {k: format_quantity(k, v) for k, v in used.items()}}
            if quota.get("status") != status:
                self.store.put(res, {**quota, "status": status})


def _show(keys: list[str], values: dict[str, Decimal]) -> str:
    return ",".join(f"{k}={format_quantity(k, values[k])}" for k in keys)


def _unspecified(spec: JSON, hard: JSON) -> str:
    """Containers missing a request/limit a compute quota tracks (``cpu`` means
    ``requests.cpu``), in the real message's form."""
    missing: dict[str, list[str]] = {}
    for c in spec.get("containers") or []:
        for key in sorted(set(hard) & set(COMPUTE)):
            kind, _, res = key.rpartition(".")
            have = _resource_list(c, "limits" if kind == "limits" else "requests")
            if res not in have:
                missing.setdefault(key, []).append(c["name"])
    return "; ".join(f"{k} for: {','.join(sorted(v))}" for k, v in sorted(missing.items()))


def _min_max(item: JSON, requests: JSON, limits: JSON) -> list[str]:
    errors = []
    for k, bound in (item.get("max") or {}).items():
        enforced = parse_quantity(bound)
        if k not in limits:
            errors.append(f"maximum {k} usage per Container is {bound}.  No limit is specified")
        elif parse_quantity(limits[k]) > enforced:
            errors.append(f"maximum {k} usage per Container is {bound}, but limit is "
                          f"{limits[k]}")
        elif k in requests and parse_quantity(requests[k]) > enforced:
            errors.append(f"maximum {k} usage per Container is {bound}, but request is "
                          f"{requests[k]}")
    for k, bound in (item.get("min") or {}).items():
        enforced = parse_quantity(bound)
        if k not in requests:
            errors.append(f"minimum {k} usage per Container is {bound}.  No request is "
                          "specified")
        elif parse_quantity(requests[k]) < enforced:
            errors.append(f"minimum {k} usage per Container is {bound}, but request is "
                          f"{requests[k]}")
        elif k in limits and parse_quantity(limits[k]) < enforced:
            errors.append(f"minimum {k} usage per Container is {bound}, but limit is "
                          f"{limits[k]}")
    return errors

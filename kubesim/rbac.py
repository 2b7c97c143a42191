"""Authentication by bearer token and RBAC authorization, as an API server does them.

Why: our code runs in a cluster under the chart's Roles; a verb the Role does not grant is a 403
there, so it must be one here, and a verb granted but never used is a privilege nobody needs.

- **Authentication**: ``Authorization: Bearer TOKEN``. Tokens are issued for ServiceAccounts
  (:meth:`Rbac.issue_token`; the account must still exist when the token is used) or are
  built-in (the harness's own components and the admin kubeconfig: group ``system:masters``).
  An unknown token is 401 Unauthorized; no token is ``system:anonymous``.
- **Authorization**: Roles/RoleBindings/ClusterRoles/ClusterRoleBindings stored in the API
  (``rbac.authorization.k8s.io/v1``), evaluated per request on (verb, API group, resource,
  subresource, namespace, name) with the real matching rules (``*``, ``resource/subresource``,
  ``*/subresource``, resourceNames). ``system:masters`` may do anything; every authenticated
  user may read discovery, everyone /healthz and /version. Denied: 403 with the API server's
  words (``jobs.batch is forbidden: User "system:serviceaccount:ns:sa" cannot create resource
  "jobs" in API group "batch" in the namespace "ns"``).
- Every decision is recorded, so tests can list the verbs an identity exercised against the
  verbs its roles grant (:meth:`Rbac.exercised`, :meth:`Rbac.granted`).
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from dataclasses import dataclass

from .objects import JSON
from .resources import RBAC, lookup
from .store import Store

#: The token of this package's own components (kubelet, controllers, ``kube.create``).
HARNESS_TOKEN = "tunehub-kube-harness-token"
#: The token of ``kube.kubeconfig``: a cluster admin, like kubeadm's admin.conf.
ADMIN_TOKEN = "emulator-token"
MASTERS = "system:masters"
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version")


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @property
    def admin(self) -> bool:
        return MASTERS in self.groups


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Request:
    """The authorizer's attributes of one resource request."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class Unauthorized(Exception):
    """An unknown or stale token: 401."""


def service_account_user(namespace: str, name: str) -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                 "system:authenticated"))


def grant(name: str, rules: list[JSON], subjects: list[JSON], cluster: bool = False
          ) -> list[JSON]:
    """A Role and its RoleBinding (``cluster``: a ClusterRole and ClusterRoleBinding) giving
    ``subjects`` the ``rules``, ready for ``kube.apply``."""
    kind = "ClusterRole" if cluster else "Role"
    return [{"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": {"name": name},
             "rules": rules},
            {"apiVersion": f"{RBAC}/v1", "kind": f"{kind}Binding", "metadata": {"name": name},
             "subjects": subjects, "roleRef": {"apiGroup": RBAC, "kind": kind, "name": name}}]


def forbidden_message(user: User, req: Request) -> str:
    """The API server's message for a denied resource request."""
    qualified = f"{req.resource}.{req.group}" if req.group else req.resource
    what = f'{qualified} "{req.name}"' if req.name else qualified
    where = (f'in the namespace "{req.namespace}"' if req.namespace
             else "at the cluster scope")
    return (f'{what} is forbidden: User "{user.name}" cannot {req.verb} resource '
            f'"{req.full_resource}" in API group "{req.group}" {where}')


def _rule_allows(rule: JSON, req: Request) -> bool:
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    verbs, names = rule.get("verbs") or [], rule.get("resourceNames") or []
    if "*" not in verbs and req.verb not in verbs:
        return False
    if "*" not in groups and req.group not in groups:
        return False
    if not any(r == "*" or r == req.full_resource
               or (req.subresource and r == f"*/{req.subresource}") for r in resources):
        return False
    return not names or req.name in names


class Rbac:
    """Tokens, RBAC evaluation from the store, and the record of decisions (thread-safe
    reads: tests call :meth:`exercised` from their own thread)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tokens: dict[str, User | tuple[str, str]] = {
            HARNESS_TOKEN: User("system:kube-controller-manager",
                                (MASTERS, "system:authenticated")),
            ADMIN_TOKEN: User("kubernetes-admin", (MASTERS, "system:authenticated")),
        }
        self._lock = threading.Lock()
        self._decisions: Counter[tuple[str, str, str, str, str, bool]] = Counter()

    # -- authentication ----------------------------------------------------------------------
    def issue_token(self, namespace: str, service_account: str) -> str:
        """A token for ``system:serviceaccount:NAMESPACE:NAME`` (like the TokenRequest API)."""
        token = f"sa.{namespace}.{service_account}.{secrets.token_hex(8)}"
        self._tokens[token] = (namespace, service_account)
        return token

    def authenticate(self, header: str | None) -> User:
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        found = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise Unauthorized()
        if isinstance(found, User):
            return found
        namespace, name = found
        sas = lookup("", "v1", "serviceaccounts")
        assert sas is not None
        if self.store.get(sas, namespace, name) is None:  # bound tokens die with their SA
            raise Unauthorized()
        return service_account_user(namespace, name)

    # -- authorization -----------------------------------------------------------------------
    def allows_path(self, user: User, path: str) -> bool:
        """Non-resource URLs: public health and version; discovery for anyone authenticated;
        otherwise ``nonResourceURLs`` rules of the user's ClusterRoles (``/apis/*``)."""
        if user.admin or path.rstrip("/") in PUBLIC_PATHS:
            return True
        if "system:authenticated" in user.groups:
            return True
        return any("get" in (rule.get("verbs") or []) or "*" in (rule.get("verbs") or [])
                   for rule in self._rules(user, "")
                   for url in rule.get("nonResourceURLs") or []
                   if url == path or (url.endswith("*") and path.startswith(url[:-1])))

    def authorize(self, user: User, req: Request) -> bool:
        allowed = user.admin or any(_rule_allows(rule, req)
                                    for rule in self._rules(user, req.namespace))
        if not user.admin:
            with self._lock:
                self._decisions[(user.name, req.namespace, req.group, req.full_resource,
                                 req.verb, allowed)] += 1
        return allowed

    def _subject_matches(self, subject: JSON, user: User, binding_ns: str) -> bool:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User":
            return name == user.name
        if kind == "Group":
            return name in user.groups
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or binding_ns
            return user.name == f"system:serviceaccount:{ns}:{name}"
        return False

    def _role_rules(self, ref: JSON, namespace: str) -> list[JSON]:
        plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        res = lookup(RBAC, "v1", plural)
        assert res is not None
        role = self.store.get(res, "" if plural == "clusterroles" else namespace,
                              ref.get("name", ""))
        return list((role or {}).get("rules") or [])

    def _rules(self, user: User, namespace: str) -> list[JSON]:
        """Every rule that applies to ``user`` in ``namespace`` ("" = cluster scope)."""
        rules: list[JSON] = []
        crbs = lookup(RBAC, "v1", "clusterrolebindings")
        rbs = lookup(RBAC, "v1", "rolebindings")
        assert crbs is not None and rbs is not None
        for binding in self.store.list(crbs, None):
            if any(self._subject_matches(s, user, "") for s in binding.get("subjects") or []):
                rules += self._role_rules(binding.get("roleRef") or {}, "")
        if namespace:
            for binding in self.store.list(rbs, namespace):
                if any(self._subject_matches(s, user, namespace)
                       for s in binding.get("subjects") or []):
                    rules += self._role_rules(binding.get("roleRef") or {}, namespace)
        return rules

    # -- what tests read ---------------------------------------------------------------------
    def exercised(self, user: str, allowed: bool | None = True) -> set[tuple[str, str, str]]:
        """``{(api group, resource[/subresource], verb)}`` ``user`` was allowed (or denied,
        or either with ``allowed=None``)."""
        with self._lock:
            return {(g, r, v) for (u, _, g, r, v, ok) in self._decisions
                    if u == user and (allowed is None or ok == allowed)}

    def granted(self, user: User, namespace: str) -> set[tuple[str, str, str]]:
        """``{(api group, resource, verb)}`` the roles bound to ``user`` grant in
        ``namespace`` (wildcards kept as ``*``)."""
        out = set()
        for rule in self._rules(user, namespace):
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        out.add((g, r, v))
        return out

    def reset(self) -> None:
        with self._lock:
            self._decisions.clear()

"""Pod Security Admission: the ``baseline`` and ``restricted`` Pod Security Standards, enforced
on pods of namespaces labelled ``pod-security.kubernetes.io/enforce``, with the API server's
messages (``pods "x" is forbidden: violates PodSecurity "restricted:latest":
allowPrivilegeEscalation != false (container "c" must set
securityContext.allowPrivilegeEscalation=false), ...``).

Why: a pod a restricted namespace refuses never runs on a real cluster, so it must not run here.
Checks are listed in the order the real plugin reports them (baseline check ids sorted, then
restricted ones; a restricted check replaces the baseline check it tightens). Not emulated:
AppArmor, SELinux options, procMount, sysctls, Windows hostProcess, probe hosts, user
namespaces (``hostUsers: false``), the audit and warn modes (only enforce) and exemptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .objects import JSON

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
ALLOWED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                   "persistentVolumeClaim", "projected", "secret")

Violation = tuple[str, str]  # (reason, detail)


def _containers(spec: JSON) -> list[JSON]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _sc(obj: JSON, key: str) -> Any:
    return (obj.get("securityContext") or {}).get(key)


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def _who(names: list[str], noun: str = "container") -> str:
    return f"{noun if len(names) == 1 else noun + 's'} {_quote(names)}"


def _setters(pod: bool, names: list[str]) -> str:
    return " and ".join((["pod"] if pod else []) + ([_who(names)] if names else []))


def host_namespaces(spec: JSON) -> Violation | None:
    found = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    return ("host namespaces", ", ".join(found)) if found else None


def host_path_volumes(spec: JSON) -> Violation | None:
    bad = [v["name"] for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return ("hostPath volumes", _who(bad, "volume")) if bad else None


def host_ports(spec: JSON) -> Violation | None:
    bad, ports = [], set()
    for c in _containers(spec):
        used = [int(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c["name"])
            ports.update(used)
    if not bad:
        return None
    listed = ", ".join(str(p) for p in sorted(ports, key=str))
    return ("hostPort", f"{_who(bad)} {'uses' if len(bad) == 1 else 'use'} "
                        f"{'hostPort' if len(ports) == 1 else 'hostPorts'} {listed}")


def privileged(spec: JSON) -> Violation | None:
    bad = [c["name"] for c in _containers(spec) if _sc(c, "privileged") is True]
    return ("privileged", f"{_who(bad)} must not set securityContext.privileged=true"
            ) if bad else None


def capabilities_baseline(spec: JSON) -> Violation | None:
    bad, caps = [], set()
    for c in _containers(spec):
        extra = [a for a in (_sc(c, "capabilities") or {}).get("add") or []
                 if a not in BASELINE_CAPABILITIES]
        if extra:
            bad.append(c["name"])
            caps.update(extra)
    return ("non-default capabilities", f"{_who(bad)} must not include "
            f"{_quote(sorted(caps))} in securityContext.capabilities.add") if bad else None


def seccomp_baseline(spec: JSON) -> Violation | None:
    return _seccomp(spec, restricted=False)


def allow_privilege_escalation(spec: JSON) -> Violation | None:
    bad = [c["name"] for c in _containers(spec)
           if _sc(c, "allowPrivilegeEscalation") is not False]
    return ("allowPrivilegeEscalation != false", f"{_who(bad)} must set "
            "securityContext.allowPrivilegeEscalation=false") if bad else None


def capabilities_restricted(spec: JSON) -> Violation | None:
    no_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _sc(c, "capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            no_drop.append(c["name"])
        extra = [a for a in capabilities.get("add") or []
                 if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c["name"])
            caps.update(extra)
    details = []
    if no_drop:
        details.append(f'{_who(no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_who(adding)} must not include {_quote(sorted(caps))} in "
                       "securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def restricted_volumes(spec: JSON) -> Violation | None:
    bad, types = [], set()
    for v in spec.get("volumes") or []:
        if any(v.get(k) is not None for k in ALLOWED_VOLUMES):
            continue
        bad.append(v["name"])
        types.add(next((k for k in v if k != "name"), "unknown"))
    if not bad:
        return None
    return ("restricted volume types",
            f"{_who(bad, 'volume')} {'uses' if len(bad) == 1 else 'use'} restricted volume "
            f"{'type' if len(types) == 1 else 'types'} {_quote(sorted(types))}")


def run_as_non_root(spec: JSON) -> Violation | None:
    pod = _sc(spec, "runAsNonRoot")
    explicit = [c["name"] for c in _containers(spec) if _sc(c, "runAsNonRoot") is False]
    if pod is False or explicit:
        return ("runAsNonRoot != true", f"{_setters(pod is False, explicit)} must not set "
                                        "securityContext.runAsNonRoot=false")
    implicit = [c["name"] for c in _containers(spec)
                if _sc(c, "runAsNonRoot") is None and pod is not True]
    return ("runAsNonRoot != true", f"pod or {_who(implicit)} must set "
            "securityContext.runAsNonRoot=true") if implicit else None


def run_as_user(spec: JSON) -> Violation | None:
    pod = _sc(spec, "runAsUser") == 0
    bad = [c["name"] for c in _containers(spec) if _sc(c, "runAsUser") == 0]
    return ("runAsUser=0", f"{_setters(pod, bad)} must not set runAsUser=0"
            ) if pod or bad else None


def seccomp_restricted(spec: JSON) -> Violation | None:
    return _seccomp(spec, restricted=True)


def _seccomp(spec: JSON, restricted: bool) -> Violation | None:
    good = ("RuntimeDefault", "Localhost")
    pod = _sc(spec, "seccompProfile")
    pod_bad = isinstance(pod, dict) and pod.get("type") not in good
    values = {str(pod.get("type"))} if pod_bad else set()
    explicit, implicit = [], []
    for c in _containers(spec):
        profile = _sc(c, "seccompProfile")
        if isinstance(profile, dict):
            if profile.get("type") not in good:
                explicit.append(c["name"])
                values.add(str(profile.get("type")))
        elif restricted and not (isinstance(pod, dict) and not pod_bad):
            implicit.append(c["name"])
    if pod_bad or explicit:
        return ("seccompProfile", f"{_setters(pod_bad, explicit)} must not set "
                f"securityContext.seccompProfile.type to {_quote(sorted(values))}")
    return ("seccompProfile", f'pod or {_who(implicit)} must set securityContext.'
            'seccompProfile.type to "RuntimeDefault" or "Localhost"') if implicit else None


Check = Callable[[JSON], "Violation | None"]
BASELINE: tuple[Check, ...] = (capabilities_baseline, host_namespaces, host_path_volumes,
                               host_ports, privileged, seccomp_baseline)
#: baseline checks the restricted ones replace are left out (capabilities, hostPath, seccomp)
RESTRICTED: tuple[Check, ...] = (host_namespaces, host_ports, privileged,
                                 allow_privilege_escalation, capabilities_restricted,
                                 restricted_volumes, run_as_non_root, run_as_user,
                                 seccomp_restricted)


def policy(namespace: JSON | None) -> tuple[str, str]:
    """The namespace's enforced (level, version); an invalid level enforces restricted, as
    the real plugin does."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level not in LEVELS:
        level = "restricted"
    return level, labels.get(VERSION_LABEL, "latest")


def violations(level: str, spec: JSON) -> list[Violation]:
    checks = {"baseline": BASELINE, "restricted": RESTRICTED}.get(level, ())
    return [v for v in (check(spec) for check in checks) if v is not None]


def describe(found: list[Violation]) -> str:
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in found)


def refusal(name: str, level: str, version: str, found: list[Violation]) -> str:
    """The API server's message for a pod that violates the namespace's policy."""
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": ' \
           f"{describe(found)}"


def warning(level: str, version: str, found: list[Violation]) -> str:
    """What the API server warns when a workload's pod template would violate the policy."""
    return f'would violate PodSecurity "{level}:{version}": {describe(found)}'

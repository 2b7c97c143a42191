"""Update rules a real API server enforces: most of a pod's spec and a Job's template,
selector and completion mode cannot change once created. The new object is defaulted the
same way as on create before comparing, so a read-modify-write of the stored object passes."""

from __future__ import annotations

import copy

from .admission import default_pod_spec
from .objects import JSON
from .validation import Invalid

#: Template fields a suspended Job that never started may change (Kueue relies on this).
SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "affinity", "schedulingGates")
_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds",
                "schedulingGates")


def _pod_spec_view(spec: JSON) -> JSON:
    view = copy.deepcopy(spec)
    for key in _POD_MUTABLE:
        view.pop(key, None)
    for group in ("containers", "initContainers"):
        for c in view.get(group) or []:
            c.pop("image", None)
    return view


def _defaulted_pod_spec(new: JSON, old: JSON) -> JSON:
    spec = copy.deepcopy(new)
    default_pod_spec(spec)
    for key in ("nodeName", "priority", "serviceAccountName", "serviceAccount",
                "preemptionPolicy", "priorityClassName"):
        if key in old and key not in spec:
            spec[key] = old[key]
    return spec


def check_pod_update(old: JSON, new: JSON) -> None:
    spec = _defaulted_pod_spec(new.get("spec") or {}, old.get("spec") or {})
    view, old_view = _pod_spec_view(spec), _pod_spec_view(old.get("spec") or {})
    if (old.get("spec") or {}).get("schedulingGates"):
        # A gated pod's scheduling directives may still change (Kueue's flavor assignment).
        for key in ("nodeSelector", "affinity"):
            view.pop(key, None)
            old_view.pop(key, None)
    if view != old_view:
        raise Invalid("spec", "Forbidden: pod updates may not change fields other than "
                              "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                              "`spec.activeDeadlineSeconds`, `spec.tolerations` (only "
                              "additions to existing tolerations), "
                              "`spec.terminationGracePeriodSeconds`")
    new["spec"] = spec


def check_job_update(old: JSON, new: JSON) -> None:
    ospec, nspec = old.get("spec") or {}, new.setdefault("spec", {})
    for key in ("selector", "completionMode", "manualSelector", "podReplacementPolicy",
                "backoffLimit", "completions", "parallelism", "suspend"):
        if key in ospec and key not in nspec:
            nspec[key] = ospec[key]
    template = nspec.setdefault("template", {})
    otemplate = ospec.get("template") or {}
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for k, v in ((otemplate.get("metadata") or {}).get("labels") or {}).items():
        if "controller-uid" in k or "job-name" in k:
            labels.setdefault(k, v)
    template["spec"] = _defaulted_pod_spec(template.get("spec") or {}, otemplate.get("spec") or {})
    for key in ("selector", "completionMode"):
        if nspec.get(key) != ospec.get(key):
            raise Invalid(f"spec.{key}", "Invalid value: field is immutable")
    if nspec.get("completions") != ospec.get("completions") and not (
            nspec.get("completionMode") == "Indexed"
            and nspec.get("completions") == nspec.get("parallelism")):
        raise Invalid("spec.completions", "Invalid value: field is immutable")
    if template == otemplate:
        return
    never_started = ospec.get("suspend") and not (old.get("status") or {}).get("startTime")
    if never_started:
        strip_new, strip_old = copy.deepcopy(template), copy.deepcopy(otemplate)
        for t in (strip_new, strip_old):
            t.pop("metadata", None)
            for key in SCHEDULING_DIRECTIVES:
                t["spec"].pop(key, None)
        if strip_new == strip_old:
            return
    raise Invalid("spec.template", "Invalid value: field is immutable")


def check_update(plural: str, old: JSON, new: JSON) -> None:
    """Raise :class:`Invalid` if ``new`` changes what cannot change; may fill defaults."""
    if plural == "pods":
        check_pod_update(old, new)
    elif plural == "jobs":
        check_job_update(old, new)

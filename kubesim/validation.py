"""Schema validation of every object the emulator stores, as a real API server would do it.

Objects are checked against the Kubernetes OpenAPI schema shipped by ``kubernetes-validate``
(strict: unknown fields are errors) for :data:`K8S_VERSION`, Kueue's objects against Kueue's own
v1beta2 CRD schemas (:data:`KUEUE_CRDS`, strict the same way), plus the handful of semantic rules
that the schema cannot express but that real clusters enforce and our code is likely to trip
over (object and label names, requests <= limits, extended resources such as nvidia.com/gpu)."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import importlib_resources
import jsonschema
from kubernetes.utils.quantity import parse_quantity as _client_parse_quantity
from referencing import Registry, Resource

from .objects import JSON

#: Kubernetes minor version whose OpenAPI schema is enforced (kubernetes-asyncio 36 = 1.36).
K8S_VERSION = "1.36"

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods"}


class Invalid(Exception):
    """An object a real API server would refuse with 422 Invalid; ``field`` names the path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def parse_quantity(value: Any) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "2Gi", 1) into a Decimal with the Kubernetes
    client's parser; raise ValueError with the API server's message."""
    try:
        return Decimal(_client_parse_quantity(value))
    except (ValueError, InvalidOperation):
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {value!r})"
                         ) from None


@functools.lru_cache(maxsize=1)
def _registry() -> tuple[str, Registry]:
    from kubernetes_validate import utils

    version = [v for v in utils.all_versions()
               if utils.major_minor(v) <= K8S_VERSION][-1]
    schema_dir = f"v{version}-local-strict"
    root = importlib_resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    defs = json.loads(root.joinpath(schema_dir, "_definitions.json").read_text())
    return schema_dir, Resource.from_contents(defs) @ Registry()


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Validator | None:
    schema_dir, registry = _registry()
    short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    root = importlib_resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    path = root.joinpath(schema_dir, f"{kind.lower()}-{short}.json")
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    return jsonschema.validators.Draft202012Validator(
        schema, registry=Resource.from_contents(schema) @ registry)


#: Kueue's v1beta2 CRD schemas (kubesim/crds/vendor_kueue.py made them from Kueue's repo).
KUEUE_CRDS = Path(__file__).resolve().parent / "crds" / "kueue-v1beta2.json"


def _strict(node: Any) -> Any:
    """A CRD schema as ``kubectl apply --validate=strict`` enforces it: unknown fields are
    errors wherever the schema lists fields and does not preserve unknown ones."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Validator | None:
    data = json.loads(KUEUE_CRDS.read_text())
    if api_version != f"kueue.x-k8s.io/{data['version']}" or kind not in data["schemas"]:
        return None
    return jsonschema.validators.Draft202012Validator(_strict(data["schemas"][kind]))


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate_schema(obj: JSON) -> None:
    """Raise :class:`Invalid` if ``obj`` does not match its kind's OpenAPI schema."""
    validator = (_validator(obj.get("apiVersion", ""), obj.get("kind", ""))
                 or _crd_validator(obj.get("apiVersion", ""), obj.get("kind", "")))
    if validator is None:  # other custom resources: no schema here, structure only
        return
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        message = error.message
        if error.validator == "additionalProperties":
            message = f"unknown field: {message}"
        raise Invalid(_path(error), message)


def _check_name(name: str, field: str, pattern: re.Pattern[str], limit: int, what: str) -> None:
    if len(name) > limit:
        raise Invalid(field, f"Invalid value: {name!r}: must be no more than {limit} characters")
    if not pattern.match(name):
        raise Invalid(field, f"Invalid value: {name!r}: a lowercase RFC 1123 {what} must "
                             "consist of lower case alphanumeric characters, '-' or '.'")


def _check_labels(labels: JSON, field: str) -> None:
    for key, value in labels.items():
        name = key.rsplit("/", 1)[-1]
        if len(name) > 63 or not _QUALIFIED_NAME.match(name):
            raise Invalid(f"{field}", f"Invalid value: {key!r}: name part must consist of "
                                      "alphanumeric characters, '-', '_' or '.' (max 63)")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise Invalid(f"{field}", f"Invalid value: {value!r}: a valid label must be an "
                                      "empty string or consist of alphanumeric characters, "
                                      "'-', '_' or '.' (max 63)")


def _check_resources(container: JSON, field: str) -> None:
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    for kind, values in (("requests", requests), ("limits", limits)):
        for name, q in values.items():
            try:
                amount = parse_quantity(q)
            except ValueError as exc:
                raise Invalid(f"{field}.resources.{kind}[{name}]", str(exc)) from None
            if name not in _STANDARD_RESOURCES and "/" in name and amount != int(amount):
                raise Invalid(f"{field}.resources.{kind}[{name}]",
                              f"Invalid value: {q!r}: must be an integer")
    for name, q in requests.items():
        if name in limits and parse_quantity(q) > parse_quantity(limits[name]):
            raise Invalid(f"{field}.resources.requests", f"Invalid value: {q!r}: must be less "
                                                        f"than or equal to {name} limit")
        if (name not in _STANDARD_RESOURCES and "/" in name
                and parse_quantity(q) != parse_quantity(limits.get(name, q))):
            raise Invalid(f"{field}.resources.requests[{name}]",
                          f"Invalid value: {q!r}: must be equal to {name} limit")
        if name not in _STANDARD_RESOURCES and "/" in name and name not in limits:
            raise Invalid(f"{field}.resources.limits[{name}]",
                          "Required value: Limit must be set for non overcommitable resources")


def _check_pod_spec(spec: JSON, field: str) -> None:
    names = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            cfield = f"{field}.{group}[{i}]"
            _check_name(c.get("name", ""), f"{cfield}.name", _DNS1123_LABEL, 63, "label")
            if c["name"] in names:
                raise Invalid(f"{cfield}.name", f"Duplicate value: {c['name']!r}")
            names.add(c["name"])
            _check_resources(c, cfield)
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    for i, c in enumerate(spec.get("containers") or []):
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes:
                raise Invalid(f"{field}.containers[{i}].volumeMounts[{j}].name",
                              f"Not found: {m.get('name')!r}")


def _check_data(obj: JSON, kind: str) -> None:
    size = 0
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not _DATA_KEY.match(key):
                raise Invalid(f"{field}[{key}]", f"Invalid value: {key!r}: a valid config key "
                                                 "must consist of alphanumeric characters, "
                                                 "'-', '_' or '.'")
            if kind == "Secret" or field == "binaryData":
                try:
                    size += len(base64.b64decode(value, validate=True))
                except (binascii.Error, ValueError):
                    raise Invalid(f"{field}[{key}]",
                                  "Invalid value: illegal base64 data") from None
            else:
                size += len(str(value).encode())
    if size > 1024 * 1024:
        raise Invalid("data", f"Too long: must have at most 1048576 bytes (got {size})")


def validate_semantics(obj: JSON) -> None:
    """The rules a real API server enforces beyond the schema, for the kinds we care about."""
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    name = meta.get("name", "")
    if kind in ("Service",):
        _check_name(name, "metadata.name", _DNS1035_LABEL, 63, "label")
    elif kind == "Job":
        _check_name(name, "metadata.name", _DNS1123_SUBDOMAIN, 63, "subdomain")
    elif kind not in ("LocalQueue", "ClusterQueue", "ResourceFlavor", "Workload"):
        _check_name(name, "metadata.name", _DNS1123_SUBDOMAIN, 253, "subdomain")
    _check_labels(meta.get("labels") or {}, "metadata.labels")
    if kind in ("Secret", "ConfigMap"):
        _check_data(obj, kind)
    if kind == "Pod":
        _check_pod_spec(obj.get("spec") or {}, "spec")
    if kind == "Job":
        template = (obj.get("spec") or {}).get("template") or {}
        tspec = template.get("spec") or {}
        _check_labels((template.get("metadata") or {}).get("labels") or {},
                      "spec.template.metadata.labels")
        _check_pod_spec(tspec, "spec.template.spec")
        if tspec.get("restartPolicy") not in ("Never", "OnFailure"):
            raise Invalid("spec.template.spec.restartPolicy",
                          f"Unsupported value: {tspec.get('restartPolicy')!r}: supported "
                          "values: \"OnFailure\", \"Never\"")
        spec = obj.get("spec") or {}
        if spec.get("podFailurePolicy") and tspec.get("restartPolicy") != "Never":
            raise Invalid("spec.template.spec.restartPolicy",
                          "Invalid value: only \"Never\" is supported when podFailurePolicy "
                          "is specified")
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            raise Invalid("spec.completions",
                          "Required value: when completion mode is Indexed")


def validate(obj: JSON) -> None:
    """Validate schema then semantics; raise :class:`Invalid` with the offending field."""
    validate_schema(obj)
    validate_semantics(obj)

"""Patch formats the API server accepts: JSON merge patch (RFC 7386), strategic merge patch
(applied as a merge patch: lists are replaced, not merged by key) and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

from .objects import JSON


class PatchError(ValueError):
    """A patch document that cannot be applied (maps to 422 / 400 at the HTTP layer)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts[:-1]:
        try:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        except (KeyError, IndexError, ValueError) as exc:
            raise PatchError(f"path element {p!r} not found") from exc
    return cur


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    key = parts[-1]
    try:
        return parent[int(key)] if isinstance(parent, list) else parent[key]
    except (KeyError, IndexError, ValueError) as exc:
        raise PatchError(f"path {'/'.join(parts)!r} not found") from exc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts)
    key = parts[-1]
    if isinstance(parent, list):
        idx = len(parent) if key == "-" else int(key)
        parent.insert(idx, value)
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        raise PatchError(f"cannot add at {'/'.join(parts)!r}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _parent(doc, parts)
    key = parts[-1]
    try:
        if isinstance(parent, list):
            del parent[int(key)]
        else:
            del parent[key]
    except (KeyError, IndexError, ValueError) as exc:
        raise PatchError(f"path {'/'.join(parts)!r} not found") from exc
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)
            doc = _add(_remove(doc, parts), parts, copy.deepcopy(op.get("value"))) if parts \
                else copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, src))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise PatchError(f"test operation failed at {op.get('path')!r}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def apply_patch(content_type: str, target: JSON, body: Any) -> JSON:
    """Apply ``body`` to ``target`` according to the request's Content-Type."""
    ctype = content_type.split(";")[0].strip()
    if ctype == "application/json-patch+json":
        return json_patch(target, body)
    if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        if not isinstance(body, dict):
            raise PatchError("a merge patch must be a JSON object")
        return merge_patch(target, body)
    raise PatchError(f"unsupported patch content type {ctype!r}")

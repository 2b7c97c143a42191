"""Label and field selectors as the API server parses them (``=``, ``==``, ``!=``, ``in``,
``notin``, existence and ``!key``), so list and watch filter exactly like a cluster."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .objects import JSON

Matcher = Callable[[JSON], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


class SelectorError(ValueError):
    """A selector string that a real API server would refuse with 400 BadRequest."""


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``in (...)`` parentheses."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def _term(term: str, get: Callable[[JSON, str], str | None], allow_sets: bool) -> Matcher:
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = term.partition(op)
            key, value = key.strip(), value.strip()
            if not key:
                raise SelectorError(f"invalid selector term {term!r}")
            if op == "!=":
                return lambda o: get(o, key) != value
            return lambda o: get(o, key) == value
    m = _SET_RE.match(term)
    if not allow_sets or not m:
        raise SelectorError(f"invalid selector term {term!r}")
    neg, key, op, values = m.groups()
    if op:
        if neg:
            raise SelectorError(f"invalid selector term {term!r}")
        choices = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda o: get(o, key) in choices
        return lambda o: get(o, key) not in choices
    if neg:
        return lambda o: get(o, key) is None
    return lambda o: get(o, key) is not None


def _label(obj: JSON, key: str) -> str | None:
    return (obj.get("metadata", {}).get("labels") or {}).get(key)


def _field(obj: JSON, path: str) -> str | None:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    if cur is None:
        return "" if path in ("spec.nodeName", "status.phase") else None
    return str(cur).lower() if isinstance(cur, bool) else str(cur)


def _compile(selector: str | None, get: Callable[[JSON, str], str | None],
             allow_sets: bool) -> Matcher:
    if not selector:
        return lambda o: True
    terms = [_term(t, get, allow_sets) for t in _split_terms(selector)]
    return lambda o: all(t(o) for t in terms)


def label_matcher(selector: str | None) -> Matcher:
    """Compile a ``labelSelector`` query parameter."""
    return _compile(selector, _label, allow_sets=True)


def field_matcher(selector: str | None) -> Matcher:
    """Compile a ``fieldSelector``: any dotted path (metadata.name, status.phase, spec.nodeName,
    involvedObject.name ...) compared as a string, equality and inequality only."""
    return _compile(selector, _field, allow_sets=False)


def match_label_selector(selector: JSON | None, labels: JSON | None) -> bool:
    """Match a structured ``LabelSelector`` (matchLabels + matchExpressions) as used in specs."""
    if selector is None:
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True

"""The types kubesim's modules share for Kubernetes objects.

Objects travel as the JSON the API serves (``kind``, ``metadata``, ``spec``, ``status``...):
decoded, they are dicts keyed by field name whose values are whatever that field holds, which
is what :data:`JSON` says. Stated here once so that every module means the same thing by it.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A Kubernetes object, or any JSON object within one (a spec, a container, a status...).
JSON: TypeAlias = dict[str, Any]

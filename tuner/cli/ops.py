"""Where CLI commands act: this machine's database directly, or the tuner service's REST API.

In a tunehub notebook terminal ``TUNEHUB_API_URL`` and the server's hub token are set, and
the CLI goes through the service like the notebook client does; on a machine without the hub it
works on ``TUNEHUB_HOME`` directly. Both answer with the same JSON views.
"""

from __future__ import annotations

import builtins  # `list` names a method of a class below: its annotations say builtins.list
import os
from typing import Any

from tunehub_base.outage import REQUEST_KEY
from tuner.cli import context
from tuner.serialize import sweep_view, trials_view
from tuner.spec import SweepSpec


class LocalOps:
    remote = False

    def submit(self, spec: SweepSpec, backend: str, request_key: str | None = None
               ) -> dict[str, Any]:
        from tuner.backends import make_backend

        be = make_backend(backend, context.settings())
        return sweep_view(context.store().submit(spec, context.actor(), be,
                                                 request_key=request_key))

    def get(self, sweep_id: int) -> dict[str, Any]:
        return sweep_view(context.store().get(sweep_id, context.actor()))

    def list(self) -> list[dict[str, Any]]:
        return [sweep_view(s) for s in context.store().list(context.actor())]

    def trials(self, sweep_id: int) -> builtins.list[dict[str, Any]]:
        return trials_view(context.store(), sweep_id, context.actor())

    def cancel(self, sweep_id: int) -> dict[str, Any]:
        return sweep_view(context.store().cancel(sweep_id, context.actor()))

    def log(self, sweep_id: int, number: int) -> str:
        return context.store().read_log(sweep_id, number, context.actor()).decode(
            errors="replace")


class RemoteOps:
    remote = True

    def __init__(self) -> None:
        from tuner.sdk.client import TunerClient

        self.client = TunerClient()

    def submit(self, spec: SweepSpec, backend: str, request_key: str | None = None
               ) -> dict[str, Any]:
        return dict(self.client.request(
            "POST", "sweeps", {"spec": spec.to_dict(), "backend": backend},
            headers={REQUEST_KEY: request_key} if request_key else None))

    def get(self, sweep_id: int) -> dict[str, Any]:
        return dict(self.client.request("GET", f"sweeps/{sweep_id}"))

    def list(self) -> list[dict[str, Any]]:
        return list(self.client.request("GET", "sweeps"))

    def trials(self, sweep_id: int) -> builtins.list[dict[str, Any]]:
        return list(self.client.request("GET", f"sweeps/{sweep_id}/trials"))

    def cancel(self, sweep_id: int) -> dict[str, Any]:
        return dict(self.client.request("POST", f"sweeps/{sweep_id}/cancel"))

    def resume(self, sweep_id: int) -> dict[str, Any]:
        return dict(self.client.request("POST", f"sweeps/{sweep_id}/resume"))

    def log(self, sweep_id: int, number: int) -> str:
        return str(self.client.request("GET", f"sweeps/{sweep_id}/trials/{number}/logs"))


def ops() -> LocalOps | RemoteOps:
    return RemoteOps() if os.environ.get("TUNEHUB_API_URL") else LocalOps()

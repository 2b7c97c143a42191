"""Object-level authorization: the one place that decides whether the caller may touch the
sweep or model a route names.

Every route naming a sweep (``sweeps/{id}``, its cancel, resume, trials and logs) derives from
:class:`SweepRoute`, every route naming a model from :class:`ModelRoute`. Their ``prepare``
runs before the route's method, after :class:`~tuner.api.auth.UserHandler` identified the
caller: the object is looked up *for that caller* (:meth:`tuner.sweep_store.SweepStore.get`,
:meth:`tuner.serving.registry.Registry.versions`), so another user's object, and an id that cannot
exist, is a 404 before anything happens, whatever state the sweep is in. Methods then act only
on ``self.sweep`` / ``self.model`` (and re-check inside their own transaction where a write
depends on it).
"""

from __future__ import annotations

from tuner.api.auth import UserHandler
from tuner.api.base import parse_id
from tuner.db import SweepRow
from tuner.errors import NotFound
from tuner.spec import NAME_RE as MODEL_NAME


class SweepRoute(UserHandler):
    """A route whose first path argument is a sweep id: ``self.sweep`` is the caller's."""

    sweep: SweepRow

    async def prepare(self) -> None:
        await super().prepare()
        raw = self.path_args[0]
        sweep_id = parse_id(raw, f"sweep {raw[:40]} not found")
        self.sweep = self.ctx.store.get(sweep_id, self.actor)


class ModelRoute(UserHandler):
    """A route whose first path argument is a model name: ``self.model`` is the caller's.

    Model names are one namespace for everyone (the registry's directories are what TensorFlow
    Serving reads); a name belongs to whoever registered it first. For anyone else the model
    does not exist (404), so a name never says who owns it."""

    model: str

    async def prepare(self) -> None:
        await super().prepare()
        name = self.path_args[0]
        if not MODEL_NAME.match(name):
            raise NotFound(f"model {name[:60]} not found")
        owner = None if self.actor.admin else self.actor.name
        self.versions = self.ctx.registry.versions(name, owner=owner)
        self.model = name

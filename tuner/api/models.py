"""Models over REST: list, versions, promote."""

from __future__ import annotations

from tuner.api.auth import READ, SUBMIT, UserHandler
from tuner.api.base import ApiError
from tuner.serialize import model_version_view


class ModelsHandler(UserHandler):
    def get(self) -> None:
        actor = self.actor(READ)
        self.send(self.ctx.registry.list_models(owner=None if actor.admin else actor.name))


class ModelHandler(UserHandler):
    def get(self, name: str) -> None:
        actor = self.actor(READ)
        versions = self.ctx.registry.versions(name, owner=None if actor.admin else actor.name)
        self.send([model_version_view(v) for v in versions])


class PromoteHandler(UserHandler):
    def post(self, name: str, version: str) -> None:
        actor = self.actor(SUBMIT)
        body = self.json_body()
        stage = body.get("stage", "production")
        if stage not in ("production", "canary"):
            raise ApiError(400, f"stage: expected production | canary, got {stage!r}", "stage")
        promoted = self.ctx.registry.promote(
            name, int(version), stage=stage, actor=actor.name, is_admin=actor.admin
        )
        self.send(model_version_view(promoted))

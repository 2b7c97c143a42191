"""Models over REST: list, versions, promote. Routes naming a model are
:class:`~tuner.api.access.ModelRoute`: the model is the caller's before a method runs."""

from __future__ import annotations

from tuner.api.access import ModelRoute
from tuner.api.auth import UserHandler
from tuner.api.base import ApiError, parse_id
from tuner.serialize import model_version_view
from tuner.serving.registry import STAGES


class ModelsHandler(UserHandler):
    def get(self) -> None:
        actor = self.actor
        self.send(self.ctx.registry.list_models(owner=None if actor.admin else actor.name))


class ModelHandler(ModelRoute):
    def get(self, _name: str) -> None:
        self.send([model_version_view(v) for v in self.versions])


class PromoteHandler(ModelRoute):
    def post(self, _name: str, version: str) -> None:
        number = parse_id(version, f"model {self.model} has no version {version[:40]}")
        body = self.json_body()
        stage = body.get("stage", "production")
        if stage not in STAGES:
            raise ApiError(400, f"stage: expected {' | '.join(STAGES)}, got {stage!r}",
                           "stage")
        unknown = sorted(set(body) - {"stage"})
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r}; expected stage", unknown[0])
        promoted = self.ctx.registry.promote(
            self.model, number, stage=stage, actor=self.actor.name, is_admin=self.actor.admin
        )
        self.send(model_version_view(promoted))

"""The model registry: versions laid out as TensorFlow Serving loads them, with lineage.

``<root>/<model>/<version>/saved_model.pb``: any TensorFlow Serving pointed at ``<root>/<model>``
serves it as is. Each version records where it came from (sweep, trial, parameters, metric, code,
data) and which stage holds it (``production``, ``canary``; a replaced one becomes
``archived``). Every stage change rewrites TensorFlow Serving's model config
(``<root>/models.config``, see :mod:`tuner.serving.models_config`) so its ``stable`` and ``canary``
labels follow promotions without a restart. Writes are safe from several processes at once: a
version's directory is claimed with an atomic rename before its row is written.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from tunehub_base.options import setting
from tuner.db import Database, ModelVersion, utcnow
from tuner.errors import NotFound, TunehubError
from tuner.search.ranking import is_better
from tuner.serving import intake, names
from tuner.serving.models_config import ServedModel, ServingConfig
from tuner.spec import NAME_RE as MODEL_NAME
from tuner.spec import POLICIES

log = logging.getLogger(__name__)

#: What a full disk (or a spent quota) answers a write.
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: The stages a version can hold; a version that loses its stage becomes ``archived``.
STAGES = ("production", "canary")
ARCHIVED = "archived"


class RegistryError(TunehubError):
    """A registry request that cannot be done as asked."""


class Registry:
    def __init__(self, db: Database, root: Path, serving_root: str | None = None) -> None:
        """``serving_root``: the registry's root as TensorFlow Serving sees it, when it mounts
        the models elsewhere (``TUNEHUB_SERVING_ROOT``); the config's base paths start there."""
        self.db = db
        self.root = Path(root)
        self.serving = ServingConfig(self.root, serving_root)

    # --- writing -------------------------------------------------------------------------

    def register(
        self,
        *,
        model: str,
        source_dir: Path,
        owner: str,
        metric: str,
        direction: str,
        metric_value: float | None,
        sweep_id: int | None = None,
        trial_number: int | None = None,
        params: dict[str, Any] | None = None,
        code_location: str | None = None,
        data_path: str | None = None,
        trusted: Path = Path("/"),
        metrics: dict[str, float] | None = None,
        code_digest: str | None = None,
    ) -> ModelVersion:
        """Copy a SavedModel in as the model's next version and record its lineage. The name
        must be ``owner``'s, or free (then it becomes theirs): :mod:`tuner.serving.names`.

        ``source_dir`` was written by a trial: it is copied by :func:`intake.copy_model`'s
        no-follow walk below ``trusted`` (a directory only the platform changes), size-capped
        (``TUNEHUB_MODEL_MAX_BYTES``) and checked to be a SavedModel; a refusal is an
        :class:`intake.ModelRefused` that says why."""
        if not MODEL_NAME.match(model):
            raise RegistryError(f"model name {model!r}: use lowercase letters, digits and '-'")
        names.claim(self.db, model, owner)
        model_dir = self.root / model
        model_dir.mkdir(parents=True, exist_ok=True)
        staging = model_dir / f".incoming-{uuid.uuid4().hex}"
        try:
            intake.copy_model(Path(source_dir), staging,
                              setting("TUNEHUB_MODEL_MAX_BYTES").number(), trusted)
            version = self._claim_version(model, staging)
        except BaseException as exc:
            # Written whole into staging, then renamed: a failure leaves no version behind.
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in _FULL:
                raise RegistryError(
                    f"the model registry is full ({os.strerror(exc.errno)} under {self.root}): "
                    f"{model} was not stored; free space there and register or promote "
                    "again") from None
            raise
        with self.db.session() as s:
            row = ModelVersion(
                model=model,
                version=version,
                owner=owner,
                stage=None,
                path=str(model_dir / str(version)),
                metric=metric,
                direction=direction,
                metric_value=metric_value,
                sweep_id=sweep_id,
                trial_number=trial_number,
                params=dict(params or {}),
                code_location=code_location,
                data_path=data_path,
                metrics=dict(metrics) if metrics else None,
                code_digest=code_digest,
            )
            s.add(row)
        return row

    def _claim_version(self, model: str, staging: Path) -> int:
        """The next free version number: the rename of the staged directory onto
        ``<model>/<n>`` succeeds for exactly one writer."""
        with self.db.session() as s:
            in_db = s.scalar(select(func.max(ModelVersion.version)).where(
                ModelVersion.model == model)) or 0
        on_disk = max((int(p.name) for p in (self.root / model).iterdir() if p.name.isdigit()),
                      default=0)
        version = max(in_db, on_disk) + 1
        for _ in range(1000):
            target = self.root / model / str(version)
            try:
                os.rename(staging, target)  # fails when another writer took this number
                return version
            except OSError:
                version += 1
        raise RegistryError(f"could not find a free version number for {model}")

    def promote(
        self,
        model: str,
        version: int,
        stage: str = "production",
        actor: str = "",
        is_admin: bool = False,
        reason: str = "",
    ) -> ModelVersion:
        """Give ``stage`` to ``version``; whoever held it is archived. Both moves go into the
        versions' history with ``reason`` (by default, who did it). Idempotent: a version
        that holds ``stage`` already is left as it is (no second history entry), so a
        promotion sent again (its answer lost, the database away) changes nothing."""
        if stage not in STAGES:
            raise RegistryError(f"stage: expected {' | '.join(STAGES)}, got {stage!r}")
        with self.db.session() as s:
            row = s.scalar(
                select(ModelVersion).where(
                    ModelVersion.model == model, ModelVersion.version == version
                ).with_for_update()
            )
            if row is None or not (is_admin or row.owner == actor):
                if row is None:
                    self._model_must_exist(s, model, actor, is_admin)
                raise NotFound(f"model {model} has no version {version}")
            if row.stage != stage:
                holders = s.scalars(
                    select(ModelVersion).where(
                        ModelVersion.model == model,
                        ModelVersion.stage == stage,
                        ModelVersion.id != row.id,
                    )
                )
                why = reason or (f"promoted by {actor}" if actor else "promoted")
                for old in holders:
                    old.stage = ARCHIVED
                    _note(old, ARCHIVED, f"v{version} took {stage}: {why}")
                row.stage = stage
                row.promoted_at = utcnow()
                _note(row, stage, why)
        self.write_serving_config()
        return row

    def retire(self, model: str, version: int, reason: str) -> ModelVersion:
        """Take its stage from ``version`` (a canary rolled back), saying why."""
        with self.db.session() as s:
            row = s.scalar(
                select(ModelVersion).where(
                    ModelVersion.model == model, ModelVersion.version == version
                ).with_for_update()
            )
            if row is None:
                raise NotFound(f"model {model} has no version {version}")
            row.stage = ARCHIVED
            _note(row, ARCHIVED, reason)
        self.write_serving_config()
        return row

    def write_serving_config(self) -> Path | None:
        """Rewrite TensorFlow Serving's model config from the stages in the database. A
        failure is logged, not raised: the promotion itself is committed, and the next one
        (or the tuner's start) writes the file again."""
        try:
            return self.serving.write(self.served_models)
        except OSError as exc:
            log.error("could not write TensorFlow Serving's config %s: %s",
                      self.serving.path, exc)
            return None

    def served_models(self) -> list[ServedModel]:
        """Every model with a production or canary version: those versions, and the one that
        most recently lost its stage (still loaded while a label moves, see
        :mod:`tuner.serving.models_config`)."""
        with self.db.session() as s:
            rows = s.execute(
                select(ModelVersion.model, ModelVersion.stage, ModelVersion.version,
                       ModelVersion.promoted_at)
                .where(ModelVersion.promoted_at.is_not(None))
                .order_by(ModelVersion.promoted_at)
            ).all()
        stages: dict[str, dict[str, int]] = {}
        for model, stage, version, _ in rows:  # oldest promotion first: the last one wins
            stages.setdefault(model, {})[stage if stage in STAGES else "previous"] = version
        return [ServedModel(m, s.get("production"), s.get("canary"), s.get("previous"))
                for m, s in stages.items()]

    def apply_policy(self, version: ModelVersion, policy: str,
                     stage: str = "production") -> tuple[bool, str]:
        """A sweep's promotion policy for its new version; returns (promoted, why). ``stage``:
        where it goes, production or canary (judged against production either way: a canary
        is a candidate for production)."""
        if policy not in POLICIES:
            raise RegistryError(f"policy: expected {' | '.join(POLICIES)}, got {policy!r}")
        if policy == "never":
            return False, "policy is never"
        current = self.at_stage(version.model, "production")
        if policy == "if-better" and current is not None and current.id != version.id:
            if current.metric != version.metric:
                return False, (
                    f"production v{current.version} is measured by {current.metric}, not "
                    f"{version.metric}; promote by hand if intended"
                )
            if version.metric_value is None:
                return False, "the new version has no metric value"
            if current.metric_value is not None and not is_better(
                version.metric_value, current.metric_value, version.direction
            ):
                return False, (
                    f"{version.metric}={version.metric_value:.4g} does not beat production "
                    f"v{current.version} ({current.metric_value:.4g})"
                )
        if current is None or current.id == version.id:
            why = "first production version" if stage == "production" else ""
        else:
            why = f"beats production v{current.version}" if policy == "if-better" else ""
        self.promote(version.model, version.version, stage, is_admin=True,
                     reason=f"sweep {version.sweep_id}, policy {policy}"
                            + (f": {why}" if why else ""))
        return True, why

    # --- reading -------------------------------------------------------------------------

    def list_models(self, owner: str | None = None) -> list[dict[str, Any]]:
        """One line per model: owner, versions, which version holds each stage."""
        with self.db.session() as s:
            query = select(ModelVersion).order_by(ModelVersion.model, ModelVersion.version)
            if owner is not None:
                query = query.where(ModelVersion.owner == owner)
            rows = list(s.scalars(query))
        models: dict[str, dict[str, Any]] = {}
        for r in rows:
            m = models.setdefault(
                r.model,
                {"name": r.model, "owner": r.owner, "versions": 0, "latest": None,
                 "production": None, "canary": None, "metric": r.metric},
            )
            m["versions"] += 1
            m["latest"] = r.version
            if r.stage in STAGES:
                m[r.stage] = r.version
                m[f"{r.stage}_value"] = r.metric_value
        return list(models.values())

    def versions(self, model: str, owner: str | None = None) -> list[ModelVersion]:
        with self.db.session() as s:
            rows = list(
                s.scalars(
                    select(ModelVersion)
                    .where(ModelVersion.model == model)
                    .order_by(ModelVersion.version)
                )
            )
        if not rows or (owner is not None and rows[0].owner != owner):
            raise NotFound(f"model {model} not found")
        return rows

    def get(self, model: str, version: int, owner: str | None = None) -> ModelVersion:
        for row in self.versions(model, owner):
            if row.version == version:
                return row
        raise NotFound(f"model {model} has no version {version}")

    def at_stage(self, model: str, stage: str) -> ModelVersion | None:
        with self.db.session() as s:
            return s.scalar(
                select(ModelVersion).where(
                    ModelVersion.model == model, ModelVersion.stage == stage
                )
            )

    # --- helpers -------------------------------------------------------------------------

    @staticmethod
    def _model_must_exist(s: Any, model: str, actor: str, is_admin: bool) -> None:
        owner = s.scalar(select(ModelVersion.owner).where(ModelVersion.model == model).limit(1))
        if owner is None or not (is_admin or owner == actor):
            raise NotFound(f"model {model} not found")


def _note(row: ModelVersion, stage: str, reason: str) -> None:
    """Append a move to a version's history (a new list: the JSON column sees the change)."""
    row.history = [*(row.history or []),
                   {"stage": stage, "reason": reason, "at": utcnow().isoformat() + "Z"}]

"""Sweep specifications: the YAML file and the Python API share this one validator.

Everything a sweep needs is checked here, before anything runs, so a typo costs the user one
line of error (``space.lr.low: must be below high (got 0.1 >= 0.01)``) instead of a sweep of
failed trials. The parsed spec is plain data; :meth:`SweepSpec.to_dict` round-trips it so the
stored copy of a sweep is exactly what was validated.

:class:`SweepSpec` is the one declaration of the spec's fields: each field's default, whether it
is required, how it is read (its reader) and, where it is not plain data, how it is written back
live on the field itself. Parsing, the list of known fields, the defaults and ``to_dict`` all
walk that declaration, so a new field is one line. The values inside fields (parameter ranges,
resources, promotion, pruner) and their readers are in :mod:`tuner.spec.values`, the search
space's in :mod:`tuner.spec.space`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from tuner.spec.space import CategoricalParam, FloatParam, IntParam, Param, read_space
from tuner.spec.values import (
    DIRECTIONS,
    MAX_INT,
    MAX_PARALLELISM,
    MAX_RETRIES,
    MAX_SEED,
    MAX_TIMEOUT,
    NAME_RE,
    OUR_PRUNER_OPTIONS,
    POLICIES,
    PRIORITIES,
    PRUNER_OPTIONS,
    PRUNERS,
    SAMPLERS,
    SERVING_METRICS,
    Direction,
    Objective,
    Promote,
    PrunerSpec,
    Resources,
    SpecError,
    default_pruner,
    parse_duration,
    read_choice,
    read_int,
    read_metrics,
    read_promote,
    read_pruner,
    read_resources,
    read_str,
)

__all__ = [
    "DIRECTIONS", "MAX_INT", "MAX_PARALLELISM", "MAX_RETRIES", "MAX_SEED", "MAX_TIMEOUT",
    "NAME_RE", "OUR_PRUNER_OPTIONS", "PLATFORM_ENV", "PLATFORM_ENV_PREFIXES", "POLICIES",
    "PRIORITIES", "PRUNERS", "PRUNER_OPTIONS", "SAMPLERS", "SERVING_METRICS", "CategoricalParam",
    "FloatParam", "IntParam", "Objective", "Param", "Promote", "PrunerSpec", "Resources",
    "SpecError", "SweepSpec", "parse_duration",
]

# Variables the platform sets on trials (GPU placement, multi-worker layout, tunehub's and the
# hub's own settings and tokens): a spec's ``env`` may not set them, or a trial could grant
# itself GPUs it did not ask for, or pose as another trial.
PLATFORM_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "TF_CONFIG", "JOB_COMPLETION_INDEX", "HOME", "PYTHONUNBUFFERED",
})
PLATFORM_ENV_PREFIXES = ("TUNEHUB_", "JUPYTERHUB_", "JPY_", "KUBERNETES_")

_ENV_ASSIGNMENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# --- how each top-level field is read ---------------------------------------------------------


@dataclass
class _Reading:
    """One spec being read: the raw mapping, the directory a relative ``code`` is resolved
    against, and the fields read so far (a field may depend on an earlier one)."""

    data: Mapping[str, Any]
    base_dir: Path | None
    done: dict[str, Any] = field(default_factory=dict)


# A reader gets the reading, the field's name and its declared default (None when required).
Reader = Callable[[_Reading, str, Any], Any]


def dump(value: Any) -> Any:
    """A value type (or a plain value) as JSON-able data, from its declaration: every field
    of a dataclass, tuples as lists. A parameter's ``step`` is left out when it is the default
    (every value), so the stored spec says what the user said."""
    if isinstance(value, PrunerSpec):
        return {"type": value.type, **dict(value.options)}
    if isinstance(value, FloatParam | IntParam | CategoricalParam):
        out: dict[str, Any] = {"type": value.type}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.name != "type" and not (f.name == "step" and item == f.default):
                out[f.name] = dump(item)
        return out
    if isinstance(value, Resources | Promote | Objective):
        return {f.name: dump(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [dump(v) for v in value]
    if isinstance(value, Mapping):
        return {k: dump(v) for k, v in value.items()}
    return value



def _spec_field(
    reader: Reader,
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    required: bool = False,
) -> Any:
    """Declare a :class:`SweepSpec` field: its reader, its default (or ``factory``), and
    whether a spec must give it (a required field has no default)."""
    meta = {"read": reader, "required": required}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if required:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def _one_of(choices: tuple[str, ...]) -> Reader:
    return lambda r, key, default: read_choice(r.data, key, choices, default)


def _integer(minimum: int, maximum: int = MAX_INT) -> Reader:
    return lambda r, key, default: read_int(r.data, key, default, minimum=minimum,
                                            maximum=maximum)


def _value(read: Callable[[Any], Any]) -> Reader:
    """A reader of the field's raw value alone (None when absent)."""
    return lambda r, key, _default: read(r.data.get(key))


def _read_name(r: _Reading, key: str, _default: Any) -> str:
    name = r.data[key]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(
            key,
            "expected lowercase letters, digits and '-', starting and ending with a letter "
            f"or digit, at most 48 characters, got {name!r}",
        )
    return name


def _read_command(r: _Reading, key: str, _default: Any) -> str:
    command = r.data[key]
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        command = shlex.join(command)
    if not isinstance(command, str) or not command.strip():
        raise SpecError(key, f"expected a command line, got {command!r}")
    first = command.split(None, 1)[0]
    if _ENV_ASSIGNMENT_RE.match(first):
        raise SpecError(
            key,
            f"starts with the variable assignment {first!r}, but trials do not run in a shell: "
            "put variables under 'env' (e.g. env: {" + first.split("=", 1)[0] + ": ...})",
        )
    return command


def _read_metric(r: _Reading, key: str, _default: Any) -> str:
    """The primary metric: ``metric``, or the first of ``metrics`` (both given: the same)."""
    name = read_str(r.data, key)
    objectives = read_metrics(r.data.get("metrics"))
    if objectives and objectives[0].name != name:
        raise SpecError(key, f"must be the first of metrics ({objectives[0].name!r}), "
                             f"got {name!r:.60}")
    if not objectives and name in SERVING_METRICS:
        raise SpecError(key, f"{name} is measured by tunehub, not reported by trials: name "
                             "the trials' metric here and list it under metrics after it")
    return name


def _read_direction(r: _Reading, key: str, default: Any) -> str:
    direction = read_choice(r.data, key, DIRECTIONS, default)
    objectives = read_metrics(r.data.get("metrics"))
    if objectives and key in r.data and r.data[key] is not None \
            and direction != objectives[0].direction:
        raise SpecError(key, f"must be the first metric's direction "
                             f"({objectives[0].direction}), got {direction!r}")
    return objectives[0].direction if objectives else direction


def _read_metrics(r: _Reading, key: str, _default: Any) -> tuple[Objective, ...]:
    """A multi-objective sweep's metrics. Optuna cannot prune a multi-objective study
    (``Trial.report`` refuses it), so such a sweep is never pruned: a pruner named with
    several metrics is refused here rather than silently ignored."""
    objectives = read_metrics(r.data.get(key))
    pruner = r.data.get("pruner")
    ptype = pruner.get("type") if isinstance(pruner, Mapping) else pruner
    if len(objectives) > 1 and ptype not in (None, "none"):
        raise SpecError("pruner", "a sweep with several metrics is not pruned (Optuna cannot "
                                  "prune a multi-objective study): remove pruner, or name one "
                                  "metric")
    if len(objectives) > 1 and r.data.get("sampler") == "cmaes":
        raise SpecError("sampler", "CMA-ES optimizes one metric; with several metrics use tpe "
                                   "(multi-objective TPE), random or grid")
    return objectives


def _read_pruner(r: _Reading, key: str, _default: Any) -> PrunerSpec:
    """The pruner; a multi-objective sweep that names none gets ``none`` rather than the
    default pruner, which it could not use (see :func:`_read_metrics`)."""
    if r.data.get(key) is None and len(r.done["metrics"]) > 1:
        return read_pruner("none")
    return read_pruner(r.data.get(key))


def _read_promote_budget(r: _Reading, key: str, _default: Any) -> Promote | None:
    """``promote``, its constraints naming only what the sweep measures: its metrics and the
    serving figures tunehub takes of every saved model."""
    promote = read_promote(r.data.get(key))
    if promote is None:
        return None
    known = {r.done["metric"], *(o.name for o in r.done["metrics"]), *SERVING_METRICS}
    for name in promote.constraints:
        if name not in known:
            raise SpecError(f"promote.constraints.{name}", "not a metric of this sweep; expected "
                                                           f"one of {', '.join(sorted(known))}")
    return promote


def _read_space(r: _Reading, key: str, _default: Any) -> dict[str, Param]:
    space = read_space(r.data[key])
    if r.done.get("sampler") == "grid":
        for pname, p in space.items():
            if isinstance(p, FloatParam) and p.step is None:
                raise SpecError(
                    f"space.{pname}",
                    "the grid sampler needs discrete parameters: give this float a step, "
                    "or use int or categorical",
                )
    return space


def _read_seed(r: _Reading, key: str, default: Any) -> int | None:
    seed = r.data.get(key, default)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed <= MAX_SEED):
        raise SpecError(key, f"expected an integer from 0 to {MAX_SEED}, got {seed!r:.60}")
    return seed


def _read_code(r: _Reading, key: str, default: Any) -> str | None:
    """A directory; a relative one is resolved against the spec file's directory, which is
    also the default."""
    code = r.data.get(key, default)
    if code is not None and not isinstance(code, str):
        raise SpecError(key, f"expected a directory path, got {code!r}")
    if code is not None and r.base_dir is not None and not Path(code).is_absolute():
        code = str((r.base_dir / code).resolve())
    elif code is None and r.base_dir is not None:
        code = str(r.base_dir)
    return code


def _read_env(r: _Reading, key: str, default: Any) -> dict[str, str]:
    env = r.data.get(key) or default
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str | int | float) for k, v in env.items()
    ):
        raise SpecError(key, "expected a mapping of variable names to strings")
    for name in env:
        _check_env_name(name)
    return {k: str(v) for k, v in env.items()}


def _check_env_name(key: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise SpecError(f"env.{key}", "expected a variable name (letters, digits and '_')")
    upper = key.upper()
    if upper in PLATFORM_ENV or upper.startswith(PLATFORM_ENV_PREFIXES):
        raise SpecError(
            f"env.{key}",
            "is set by tunehub (GPU placement, TF_CONFIG, tokens and TUNEHUB_*/JUPYTERHUB_* "
            "settings belong to the platform); ask for GPUs with resources.gpu",
        )


def _read_preload(r: _Reading, key: str, default: Any) -> str | tuple[str, ...]:
    raw = r.data.get(key)
    if raw is None or raw == default:
        return default
    if raw == "none" or raw == []:
        return "none"
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(m, str) and _MODULE_RE.match(m)
                                            for m in raw):
        raise SpecError(key, f"expected auto, none or a list of module names, got {raw!r}")
    return tuple(raw)


def _read_max_failed(r: _Reading, key: str, default: Any) -> int | None:
    if r.data.get(key) is None:
        return default
    return read_int(r.data, key, 0, minimum=0)


# --- the spec ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A validated sweep spec. Fields are read, and written back, in this order; the first
    wrong one is the error a user sees."""

    name: str = _spec_field(_read_name, required=True)
    command: str = _spec_field(_read_command, required=True)
    metric: str = _spec_field(_read_metric, required=True)
    direction: Direction = _spec_field(_read_direction, "maximize")
    # Several metrics make the study multi-objective (the first is the primary one: the
    # sweep's best trial, pruning's and promotion's ranking); empty for one metric.
    metrics: tuple[Objective, ...] = _spec_field(_read_metrics, ())
    trials: int = _spec_field(_integer(minimum=1), 20)
    parallelism: int = _spec_field(_integer(minimum=1, maximum=MAX_PARALLELISM), 1)
    sampler: str = _spec_field(_one_of(SAMPLERS), "tpe")
    pruner: PrunerSpec = _spec_field(_read_pruner, factory=default_pruner)
    space: Mapping[str, Param] = _spec_field(_read_space, required=True)
    resources: Resources = _spec_field(_value(read_resources), factory=Resources)
    max_retries: int = _spec_field(_integer(minimum=0, maximum=MAX_RETRIES), 0)
    trial_timeout: float | None = _spec_field(_value(parse_duration), None)
    promote: Promote | None = _spec_field(_read_promote_budget, None)
    priority: str = _spec_field(_one_of(PRIORITIES), "normal")
    seed: int | None = _spec_field(_read_seed, None)
    code: str | None = _spec_field(_read_code, None)
    env: Mapping[str, str] = _spec_field(_read_env, factory=dict)
    # Modules the warm-start process imports before forking trials: "auto" follows the
    # snapshot's import graph, "none" preloads nothing, or an explicit list.
    preload: str | tuple[str, ...] = _spec_field(_read_preload, "auto")
    # Stop the sweep once this many trials have failed (retries spent); None: the default
    # (failure_limit), 0: never stop early.
    max_failed_trials: int | None = _spec_field(_read_max_failed, None)

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """What the study optimizes, in order: ``metrics``, or the one ``metric``."""
        return self.metrics or (Objective(self.metric, self.direction),)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def prunes(self) -> bool:
        """Whether a report can ever be answered "stop" (a multi-objective sweep is never
        pruned: Optuna cannot prune one)."""
        return self.pruner.type != "none" and not self.multi_objective

    def serving_figures(self) -> bool:
        """Whether the sweep uses the serving figures tunehub measures (as objectives or in
        its budget): only then is every saved model measured."""
        named = {o.name for o in self.objectives}
        if self.promote is not None:
            named |= set(self.promote.constraints)
        return bool(named & set(SERVING_METRICS))

    def failure_limit(self) -> int | None:
        """How many failed trials stop the sweep: ``max_failed_trials``, by default 3 or a
        tenth of the trials, whichever is more (a broken spec stops within a few trials, a
        large sweep tolerates the odd flaky one); None never stops it early."""
        if self.max_failed_trials == 0:
            return None
        if self.max_failed_trials is not None:
            return self.max_failed_trials
        return max(3, math.ceil(self.trials / 10))

    @classmethod
    def from_dict(cls, data: Any, base_dir: str | Path | None = None) -> SweepSpec:
        """Validate a mapping (parsed YAML or Python keyword arguments) into a spec.

        ``base_dir`` is where a relative ``code`` path is resolved, and the default code
        directory: the directory holding the spec file.
        """
        return _parse(data, Path(base_dir) if base_dir is not None else None)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SweepSpec:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpecError("spec", f"cannot read {path}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise SpecError("spec", f"{path} is not valid YAML{where}") from None
        return cls.from_dict(data, base_dir=path.resolve().parent)

    def to_dict(self) -> dict[str, Any]:
        """The canonical, JSON-able form; ``from_dict(to_dict())`` gives the same spec."""
        return {f.name: dump(getattr(self, f.name)) for f in fields(self)}

    def distributions(self) -> dict[str, Any]:
        """Optuna distributions for ``study.ask(fixed_distributions=...)``."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        dists: dict[str, Any] = {}
        for name, p in self.space.items():
            if isinstance(p, FloatParam):
                dists[name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
            elif isinstance(p, IntParam):
                dists[name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
            else:
                dists[name] = CategoricalDistribution(list(p.choices))
        return dists

    def grid(self) -> dict[str, list[Any]]:
        """Every value of every parameter, for the grid sampler (all parameters discrete)."""
        grid: dict[str, list[Any]] = {}
        for name, p in self.space.items():
            if isinstance(p, CategoricalParam):
                grid[name] = list(p.choices)
            elif isinstance(p, IntParam):
                grid[name] = list(range(p.low, p.high + 1, p.step))
            else:
                if p.step is None:
                    raise SpecError(f"space.{name}", "the grid sampler needs a step")
                n = int(math.floor((p.high - p.low) / p.step + 1e-9))
                grid[name] = [round(p.low + i * p.step, 12) for i in range(n + 1)]
        return grid


# --- parsing ---------------------------------------------------------------------------------

#: Every field a spec may hold, and those it must, from the declaration.
FIELDS = tuple(f.name for f in fields(SweepSpec))
REQUIRED = tuple(f.name for f in fields(SweepSpec) if f.metadata["required"])


def _no_nul(value: Any, where: str) -> None:
    """NUL characters fit no command line, path or database text column: refuse them by name."""
    if isinstance(value, str) and "\x00" in value:
        raise SpecError(where, "contains a NUL character")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _no_nul(k, where)
            _no_nul(v, f"{where}.{k}" if where != "spec" else str(k))
    elif isinstance(value, list | tuple):
        for item in value:
            _no_nul(item, where)


def _parse(data: Any, base_dir: Path | None) -> SweepSpec:
    if not isinstance(data, Mapping):
        raise SpecError("spec", f"expected a mapping of fields, got {type(data).__name__}")
    _no_nul(data, "spec")
    metrics = data.get("metrics")
    if data.get("metric") is None and isinstance(metrics, list) and metrics:
        first = metrics[0]  # the primary metric may be given as the first of metrics alone
        first = first.get("name") if isinstance(first, Mapping) else first
        if isinstance(first, str):
            data = {**data, "metric": first}
    for key in data:
        if key not in FIELDS:
            raise SpecError(key, f"unknown field; expected one of {', '.join(sorted(FIELDS))}")
    for key in REQUIRED:
        if data.get(key) in (None, "", {}, []):
            raise SpecError(key, "is required")
    reading = _Reading(data, base_dir)
    for f in fields(SweepSpec):
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = None
        reading.done[f.name] = f.metadata["read"](reading, f.name, default)
    return SweepSpec(**reading.done)

"""Sweep specifications: the YAML file and the Python API share this one validator.

Everything a sweep needs is checked here, before anything runs, so a typo costs the user one
line of error (``space.lr.low: must be below high (got 0.1 >= 0.01)``) instead of a sweep of
failed trials. The parsed spec is plain data; :meth:`SweepSpec.to_dict` round-trips it so the
stored copy of a sweep is exactly what was validated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from tuner.errors import TunehubError

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
PRUNERS = ("none", "median", "hyperband", "asha")
Direction = Literal["maximize", "minimize"]  # as Optuna's create_study takes it
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")
POLICIES = ("if-better", "always", "never")
PRIORITIES = ("low", "normal", "high")

# Options a user may pass to each pruner (``pruner: {type: hyperband, max_resource: 30}``),
# forwarded to Optuna's constructor; anything else is a typo we can name.
PRUNER_OPTIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials",
               "min_trials"),
    "hyperband": ("min_resource", "max_resource", "reduction_factor", "bootstrap_count",
                  "min_trials"),
    "asha": ("min_resource", "reduction_factor", "min_early_stopping_rate", "bootstrap_count",
             "min_trials"),
}
# ``min_trials`` is tunehub's, not Optuna's: no pruning decision at a step until that many
# trials have reported there (see tuner.pruning).
OUR_PRUNER_OPTIONS = ("min_trials",)

# Variables the platform sets on trials (GPU placement, multi-worker layout, tunehub's and the
# hub's own settings and tokens): a spec's ``env`` may not set them, or a trial could grant
# itself GPUs it did not ask for, or pose as another trial.
PLATFORM_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "TF_CONFIG", "JOB_COMPLETION_INDEX", "HOME", "PYTHONUNBUFFERED",
})
PLATFORM_ENV_PREFIXES = ("TUNEHUB_", "JUPYTERHUB_", "JPY_", "KUBERNETES_")

# Upper bounds: what the database's 32-bit columns, the samplers' arithmetic and the event
# loop's timers can hold. Beyond them a value is a typo, refused by name, never a server error.
MAX_INT = 2**31 - 1
MAX_PARALLELISM = 10_000
MAX_RETRIES = 1_000
MAX_SEED = 2**32 - 1
MAX_PARAM = 2.0**53  # exact in a float; a range must also have a finite width
MAX_TIMEOUT = 366 * 24 * 3600.0
MAX_CPU = 10_000.0

_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$")
_ENV_ASSIGNMENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


class SpecError(TunehubError, ValueError):
    """A spec field is wrong. ``str()`` is the one-line message users see."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class FloatParam:
    low: float
    high: float
    log: bool = False
    step: float | None = None
    type: Literal["float"] = "float"


@dataclass(frozen=True)
class IntParam:
    low: int
    high: int
    log: bool = False
    step: int = 1
    type: Literal["int"] = "int"


@dataclass(frozen=True)
class CategoricalParam:
    choices: tuple[Any, ...]
    type: Literal["categorical"] = "categorical"


Param = FloatParam | IntParam | CategoricalParam


@dataclass(frozen=True)
class Resources:
    cpu: float = 1.0
    memory: str = "2Gi"
    gpu: int = 0
    gpu_type: str | None = None
    workers: int = 1


@dataclass(frozen=True)
class Promote:
    model: str
    policy: str = "if-better"


@dataclass(frozen=True)
class PrunerSpec:
    type: str = "none"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    command: str
    metric: str
    space: Mapping[str, Param]
    direction: Direction = "maximize"
    trials: int = 20
    parallelism: int = 1
    sampler: str = "tpe"
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    resources: Resources = field(default_factory=Resources)
    max_retries: int = 0
    trial_timeout: float | None = None
    promote: Promote | None = None
    priority: str = "normal"
    seed: int | None = None
    code: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Modules the warm-start process imports before forking trials: "auto" follows the
    # snapshot's import graph, "none" preloads nothing, or an explicit list.
    preload: str | tuple[str, ...] = "auto"
    # Stop the sweep once this many trials have failed (retries spent); None: the default
    # (failure_limit), 0: never stop early.
    max_failed_trials: int | None = None

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
        out: dict[str, Any] = {
            "name": self.name,
            "command": self.command,
            "metric": self.metric,
            "direction": self.direction,
            "trials": self.trials,
            "parallelism": self.parallelism,
            "sampler": self.sampler,
            "pruner": {"type": self.pruner.type, **dict(self.pruner.options)},
            "space": {name: _param_to_dict(p) for name, p in self.space.items()},
            "resources": {
                "cpu": self.resources.cpu,
                "memory": self.resources.memory,
                "gpu": self.resources.gpu,
                "gpu_type": self.resources.gpu_type,
                "workers": self.resources.workers,
            },
            "max_retries": self.max_retries,
            "trial_timeout": self.trial_timeout,
            "promote": (
                {"model": self.promote.model, "policy": self.promote.policy}
                if self.promote
                else None
            ),
            "priority": self.priority,
            "seed": self.seed,
            "code": self.code,
            "env": dict(self.env),
            "preload": self.preload if isinstance(self.preload, str) else list(self.preload),
            "max_failed_trials": self.max_failed_trials,
        }
        return out

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


def parse_duration(value: Any, field_name: str = "trial_timeout") -> float | None:
    """``90``, ``"90s"``, ``"30m"``, ``"1h30m"`` -> seconds; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(field_name, f"expected a duration like 30m, 90s or 2h, got {value!r}")
    if isinstance(value, int | float):
        seconds = value if isinstance(value, float) else min(value, 2 * int(MAX_TIMEOUT))
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            m = _DURATION_RE.fullmatch(text)
            if not m or not any(m.groups()):
                raise SpecError(
                    field_name, f"expected a duration like 30m, 90s or 2h, got {value!r}"
                )
            h, mi, s = (float(g) if g else 0.0 for g in m.groups())
            seconds = h * 3600 + mi * 60 + s
    else:
        raise SpecError(field_name, f"expected a duration like 30m, 90s or 2h, got {value!r}")
    if not 0 < seconds <= MAX_TIMEOUT:
        raise SpecError(field_name, f"expected a positive duration of at most 366 days, got "
                                    f"{value!r:.60}")
    return float(seconds)


# --- parsing ---------------------------------------------------------------------------------

_TOP_FIELDS = {
    "name", "command", "metric", "direction", "trials", "parallelism", "sampler", "pruner",
    "space", "resources", "max_retries", "trial_timeout", "promote", "priority", "seed",
    "code", "env", "preload", "max_failed_trials",
}
_REQUIRED = ("name", "command", "metric", "space")


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
    _no_unknown(data, _TOP_FIELDS, prefix="")
    for key in _REQUIRED:
        if data.get(key) in (None, "", {}, []):
            raise SpecError(key, "is required")

    name = data["name"]
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(
            "name",
            "expected lowercase letters, digits and '-', starting and ending with a letter "
            f"or digit, at most 48 characters, got {name!r}",
        )
    command = data["command"]
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        import shlex

        command = shlex.join(command)
    if not isinstance(command, str) or not command.strip():
        raise SpecError("command", f"expected a command line, got {command!r}")
    first = command.split(None, 1)[0]
    if _ENV_ASSIGNMENT_RE.match(first):
        raise SpecError(
            "command",
            f"starts with the variable assignment {first!r}, but trials do not run in a shell: "
            "put variables under 'env' (e.g. env: {" + first.split("=", 1)[0] + ": ...})",
        )
    metric = _str(data, "metric")
    direction = _choice(data, "direction", DIRECTIONS, "maximize")
    trials = _int(data, "trials", 20, minimum=1)
    parallelism = _int(data, "parallelism", 1, minimum=1, maximum=MAX_PARALLELISM)
    sampler = _choice(data, "sampler", SAMPLERS, "tpe")
    pruner = _pruner(data.get("pruner"))
    space = _space(data["space"])
    if sampler == "grid":
        for pname, p in space.items():
            if isinstance(p, FloatParam) and p.step is None:
                raise SpecError(
                    f"space.{pname}",
                    "the grid sampler needs discrete parameters: give this float a step, "
                    "or use int or categorical",
                )
    resources = _resources(data.get("resources"))
    max_retries = _int(data, "max_retries", 0, minimum=0, maximum=MAX_RETRIES)
    trial_timeout = parse_duration(data.get("trial_timeout"))
    promote = _promote(data.get("promote"))
    priority = _choice(data, "priority", PRIORITIES, "normal")
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed <= MAX_SEED):
        raise SpecError("seed", f"expected an integer from 0 to {MAX_SEED}, got {seed!r:.60}")
    code = data.get("code")
    if code is not None and not isinstance(code, str):
        raise SpecError("code", f"expected a directory path, got {code!r}")
    if code is not None and base_dir is not None and not Path(code).is_absolute():
        code = str((base_dir / code).resolve())
    elif code is None and base_dir is not None:
        code = str(base_dir)
    env = data.get("env") or {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str | int | float) for k, v in env.items()
    ):
        raise SpecError("env", "expected a mapping of variable names to strings")
    for key in env:
        _check_env_name(key)
    preload = _preload(data.get("preload"))
    max_failed = data.get("max_failed_trials")
    if max_failed is not None:
        max_failed = _int(data, "max_failed_trials", 0, minimum=0)
    return SweepSpec(
        name=name,
        command=command,
        metric=metric,
        space=space,
        direction=direction,
        trials=trials,
        parallelism=parallelism,
        sampler=sampler,
        pruner=pruner,
        resources=resources,
        max_retries=max_retries,
        trial_timeout=trial_timeout,
        promote=promote,
        priority=priority,
        seed=seed,
        code=code,
        env={k: str(v) for k, v in env.items()},
        preload=preload,
        max_failed_trials=max_failed,
    )


_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _preload(raw: Any) -> str | tuple[str, ...]:
    if raw is None or raw == "auto":
        return "auto"
    if raw == "none" or raw == []:
        return "none"
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(m, str) and _MODULE_RE.match(m)
                                            for m in raw):
        raise SpecError(
            "preload", f"expected auto, none or a list of module names, got {raw!r}"
        )
    return tuple(raw)


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


def _no_unknown(data: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            raise SpecError(
                f"{prefix}{key}", f"unknown field; expected one of {', '.join(sorted(allowed))}"
            )


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(key, f"expected a non-empty string, got {value!r}")
    return value


_Choice = TypeVar("_Choice", bound=str)


def _choice(
    data: Mapping[str, Any], key: str, choices: tuple[_Choice, ...], default: _Choice
) -> _Choice:
    value = data.get(key, default)
    if value is None:
        value = default
    if value not in choices:
        raise SpecError(key, f"expected one of {' | '.join(choices)}, got {value!r}")
    return value


def _int(
    data: Mapping[str, Any], key: str, default: int, minimum: int, prefix: str = "",
    maximum: int = MAX_INT,
) -> int:
    value = data.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(prefix + key, f"expected an integer, got {value!r:.60}")
    if value < minimum:
        raise SpecError(prefix + key, f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise SpecError(prefix + key, f"must be at most {maximum}, got {value!r:.60}")
    return value


def _number(value: Any, field_name: str) -> float:
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)  # a huge int overflows
        except OverflowError:
            pass
    if not math.isfinite(number):
        raise SpecError(field_name, f"expected a finite number, got {value!r:.60}")
    return number


def _space(raw: Any) -> dict[str, Param]:
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError("space", "expected a non-empty mapping of parameter names to ranges")
    space: dict[str, Param] = {}
    for pname, pdef in raw.items():
        where = f"space.{pname}"
        if not isinstance(pname, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", pname):
            raise SpecError(where, "parameter names are letters, digits, '_', '.' and '-'")
        if not isinstance(pdef, Mapping):
            raise SpecError(where, "expected a mapping with a type (float | int | categorical)")
        ptype = pdef.get("type")
        if ptype == "float":
            space[pname] = _float_param(pdef, where)
        elif ptype == "int":
            space[pname] = _int_param(pdef, where)
        elif ptype == "categorical":
            _no_unknown(pdef, {"type", "choices"}, prefix=f"{where}.")
            choices = pdef.get("choices")
            if not isinstance(choices, list) or not choices:
                raise SpecError(f"{where}.choices", "expected a non-empty list")
            for c in choices:
                if not (c is None or isinstance(c, str | int | float | bool)):
                    raise SpecError(f"{where}.choices", f"choices must be scalars, got {c!r}")
            if len(set(map(repr, choices))) != len(choices):
                raise SpecError(f"{where}.choices", "choices must be distinct")
            space[pname] = CategoricalParam(choices=tuple(choices))
        else:
            raise SpecError(f"{where}.type", f"expected float | int | categorical, got {ptype!r}")
    return space


def _range(pdef: Mapping[str, Any], where: str, cast: type) -> tuple[Any, Any, bool]:
    for key in ("low", "high"):
        if key not in pdef:
            raise SpecError(f"{where}.{key}", "is required")
    low = _number(pdef["low"], f"{where}.low")
    high = _number(pdef["high"], f"{where}.high")
    for key, v in (("low", low), ("high", high)):
        if abs(v) > MAX_PARAM:
            raise SpecError(f"{where}.{key}", f"must be within ±2**53, got {v:g}")
    if cast is int:
        for key, v in (("low", pdef["low"]), ("high", pdef["high"])):
            if not isinstance(v, int):
                raise SpecError(f"{where}.{key}", f"expected an integer, got {v!r}")
    if low >= high:
        raise SpecError(f"{where}.low", f"must be below high (got low={low:g}, high={high:g})")
    log = pdef.get("log", False)
    if not isinstance(log, bool):
        raise SpecError(f"{where}.log", f"expected true or false, got {log!r}")
    if log and low <= 0:
        raise SpecError(f"{where}.low", f"a log scale needs low > 0, got {low:g}")
    return cast(pdef["low"]), cast(pdef["high"]), log


def _float_param(pdef: Mapping[str, Any], where: str) -> FloatParam:
    _no_unknown(pdef, {"type", "low", "high", "log", "step"}, prefix=f"{where}.")
    low, high, log = _range(pdef, where, float)
    step = pdef.get("step")
    if step is not None:
        step = _number(step, f"{where}.step")
        if step <= 0:
            raise SpecError(f"{where}.step", f"must be positive, got {step:g}")
        if log:
            raise SpecError(f"{where}.step", "cannot be combined with log: true")
        if step > high - low:
            raise SpecError(f"{where}.step", f"is larger than high - low ({high - low:g})")
    return FloatParam(low=low, high=high, log=log, step=step)


def _int_param(pdef: Mapping[str, Any], where: str) -> IntParam:
    _no_unknown(pdef, {"type", "low", "high", "log", "step"}, prefix=f"{where}.")
    low, high, log = _range(pdef, where, int)
    step = pdef.get("step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise SpecError(f"{where}.step", f"expected a positive integer, got {step!r}")
    if log and step != 1:
        raise SpecError(f"{where}.step", "cannot be combined with log: true")
    return IntParam(low=low, high=high, log=log, step=step)


def _param_to_dict(p: Param) -> dict[str, Any]:
    if isinstance(p, CategoricalParam):
        return {"type": "categorical", "choices": list(p.choices)}
    out: dict[str, Any] = {"type": p.type, "low": p.low, "high": p.high, "log": p.log}
    if isinstance(p, IntParam) and p.step != 1 or isinstance(p, FloatParam) and p.step:
        out["step"] = p.step
    return out


def _pruner(raw: Any) -> PrunerSpec:
    if raw is None:
        return PrunerSpec()
    if isinstance(raw, str):
        raw = {"type": raw}
    if not isinstance(raw, Mapping):
        raise SpecError("pruner", f"expected {' | '.join(PRUNERS)} or a mapping with a type")
    ptype = raw.get("type", "none")
    if ptype not in PRUNERS:
        raise SpecError("pruner", f"expected one of {' | '.join(PRUNERS)}, got {ptype!r}")
    options = {k: v for k, v in raw.items() if k != "type"}
    allowed = PRUNER_OPTIONS[ptype]
    for key, value in options.items():
        if key not in allowed:
            hint = ", ".join(allowed) or "no options"
            raise SpecError(f"pruner.{key}", f"unknown option for {ptype}; expected {hint}")
        if key == "max_resource" and value == "auto":
            continue
        if key == "min_trials" and (isinstance(value, bool) or not isinstance(value, int)
                                    or not 1 <= value <= MAX_INT):
            raise SpecError(f"pruner.{key}",
                            f"expected an integer of at least 1, got {value!r:.60}")
        if (isinstance(value, bool) or not isinstance(value, int | float) or value < 0
                or value > MAX_INT):
            raise SpecError(f"pruner.{key}", f"expected a non-negative number, got {value!r}")
    return PrunerSpec(type=ptype, options=options)


def _resources(raw: Any) -> Resources:
    if raw is None:
        return Resources()
    if not isinstance(raw, Mapping):
        raise SpecError("resources", "expected a mapping (cpu, memory, gpu, gpu_type, workers)")
    _no_unknown(raw, {"cpu", "memory", "gpu", "gpu_type", "workers"}, prefix="resources.")
    cpu = _number(raw.get("cpu", 1), "resources.cpu")
    if cpu > MAX_CPU:
        raise SpecError("resources.cpu", f"must be at most {MAX_CPU:g}, got {cpu:g}")
    if cpu <= 0:
        raise SpecError("resources.cpu", f"must be positive, got {cpu:g}")
    memory = str(raw.get("memory", "2Gi"))
    if not _QUANTITY_RE.match(memory):
        raise SpecError(
            "resources.memory", f"expected a Kubernetes quantity like 512Mi or 2Gi, got {memory!r}"
        )
    gpu = _int(raw, "gpu", 0, minimum=0, prefix="resources.")
    gpu_type = raw.get("gpu_type")
    if gpu_type is not None and (not isinstance(gpu_type, str) or not gpu_type):
        raise SpecError("resources.gpu_type", f"expected a GPU type name, got {gpu_type!r}")
    if gpu_type is not None and gpu == 0:
        raise SpecError("resources.gpu_type", "is set but resources.gpu is 0")
    workers = _int(raw, "workers", 1, minimum=1, prefix="resources.", maximum=1000)
    return Resources(cpu=cpu, memory=memory, gpu=gpu, gpu_type=gpu_type, workers=workers)


def _promote(raw: Any) -> Promote | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError("promote", "expected a mapping with model and policy")
    _no_unknown(raw, {"model", "policy"}, prefix="promote.")
    model = raw.get("model")
    if not isinstance(model, str) or not _NAME_RE.match(model):
        raise SpecError(
            "promote.model",
            f"expected a model name of lowercase letters, digits and '-', got {model!r}",
        )
    policy = raw.get("policy", "if-better")
    if policy not in POLICIES:
        raise SpecError("promote.policy", f"expected one of {' | '.join(POLICIES)}, got {policy!r}")
    return Promote(model=model, policy=policy)

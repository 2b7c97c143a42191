"""The values inside a sweep spec, each type next to the reader that checks it.

``resources``, ``promote``, ``pruner`` and durations, plus the small readers every field uses
(integers, choices, numbers); the parameter ranges of ``space`` are in :mod:`tuner.spec.space`.
Each value type is a frozen dataclass whose fields and defaults are the only statement of what
the value holds: its reader takes the allowed keys and the defaults from the dataclass, and
:func:`tuner.spec.dump` writes it back from the same declaration. :mod:`tuner.spec` declares the
spec's top-level fields with these readers. Errors are :class:`SpecError`, whose text is the
one line a user sees.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from tunehub_base.pool.request import PRIORITIES as PRIORITIES  # the pool orders by it too
from tuner.errors import TunehubError

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
PRUNERS = ("none", "median", "hyperband", "asha")
Direction = Literal["maximize", "minimize"]  # as Optuna's create_study takes it
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")
#: A sweep's promotion policy for the version it registers (see tuner.serving.registry.Registry).
POLICIES = ("if-better", "always", "never")
#: Where a sweep's promoted model goes.
PROMOTE_STAGES = ("production", "canary")
#: Figures the platform measures for every trial that saved a model (:mod:`tuner.serving.cost`),
#: all to minimize: a spec may name them as objectives in ``metrics`` and bound them in
#: ``promote.constraints``; trials never report them (a trial cannot grade its own serving).
SERVING_METRICS: dict[str, Direction] = {
    "serving_latency_p50_ms": "minimize",
    "serving_latency_p95_ms": "minimize",
    "model_size_mb": "minimize",
}
#: The short names ``promote.constraints`` may use for them (``latency_p95_ms: 5``).
CONSTRAINT_ALIASES = {
    "latency_p50_ms": "serving_latency_p50_ms",
    "latency_p95_ms": "serving_latency_p95_ms",
    "size_mb": "model_size_mb",
}
#: At most this many objectives: Optuna's multi-objective samplers grow with them, a chart
#: cannot show more, and a person cannot weigh more.
MAX_OBJECTIVES = 4

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
# trials have reported there (see tuner.search.pruning).
OUR_PRUNER_OPTIONS = ("min_trials",)

# Upper bounds: what the database's 32-bit columns, the samplers' arithmetic and the event
# loop's timers can hold. Beyond them a value is a typo, refused by name, never a server error.
MAX_INT = 2**31 - 1
MAX_PARALLELISM = 10_000
MAX_RETRIES = 1_000
MAX_SEED = 2**32 - 1
MAX_TIMEOUT = 366 * 24 * 3600.0
MAX_CPU = 10_000.0

#: Sweep and model names: a DNS label of at most 48 characters, so a name fits Kubernetes object
#: names, Optuna study names and TensorFlow Serving's model directories as it is.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$")
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


class SpecError(TunehubError, ValueError):
    """A spec field is wrong. ``str()`` is the one-line message users see."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


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
    #: Where a promoted model goes: production, or canary first (``model serve`` releases it
    #: gradually, :mod:`tuner.serving.canary`).
    stage: str = "production"
    #: A budget the promoted model must meet: metric (or serving figure) -> bound; an upper
    #: bound for a metric to minimize, a lower one for a metric to maximize.
    constraints: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Objective:
    """One of a multi-objective sweep's metrics (``metrics: [{name, direction}]``)."""

    name: str
    direction: Direction = "maximize"


@dataclass(frozen=True)
class PrunerSpec:
    type: str = "none"
    options: Mapping[str, Any] = field(default_factory=dict)


def names(cls: type) -> set[str]:
    """The keys a spec mapping may hold for the value type ``cls``: its fields."""
    return {f.name for f in fields(cls)}


def default_of(cls: type, name: str) -> Any:
    """The declared default of field ``name`` of the dataclass ``cls``."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    raise KeyError(name)


# --- small readers ---------------------------------------------------------------------------


def no_unknown(data: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            raise SpecError(
                f"{prefix}{key}", f"unknown field; expected one of {', '.join(sorted(allowed))}"
            )


def read_str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(key, f"expected a non-empty string, got {value!r}")
    return value


def read_choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = data.get(key, default)
    if value is None:
        value = default
    if value not in choices:
        raise SpecError(key, f"expected one of {' | '.join(choices)}, got {value!r}")
    return value


def read_int(
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


def read_number(value: Any, field_name: str) -> float:
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)  # a huge int overflows
        except OverflowError:
            pass
    if not math.isfinite(number):
        raise SpecError(field_name, f"expected a finite number, got {value!r:.60}")
    return number


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


# --- pruner, resources, promote --------------------------------------------------------------


#: The pruner of a spec that names none (``pruner: none`` still turns pruning off). Chosen by
#: measurement: ``benchmarks/search.py`` and the README's "Search defaults" (issue 28).
DEFAULT_PRUNER: Mapping[str, Any] = {"type": "asha", "min_resource": 3}


def default_pruner() -> PrunerSpec:
    """A fresh :data:`DEFAULT_PRUNER` (the spec field's factory)."""
    return read_pruner(DEFAULT_PRUNER)


def read_pruner(raw: Any) -> PrunerSpec:
    if raw is None:
        return default_pruner()
    if isinstance(raw, str):
        raw = {"type": raw}
    if not isinstance(raw, Mapping):
        raise SpecError("pruner", f"expected {' | '.join(PRUNERS)} or a mapping with a type")
    ptype = raw.get("type", default_of(PrunerSpec, "type"))
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


def read_resources(raw: Any) -> Resources:
    if raw is None:
        return Resources()
    keys = [f.name for f in fields(Resources)]
    if not isinstance(raw, Mapping):
        raise SpecError("resources", f"expected a mapping ({', '.join(keys)})")
    no_unknown(raw, set(keys), prefix="resources.")
    cpu = read_number(raw.get("cpu", default_of(Resources, "cpu")), "resources.cpu")
    if cpu > MAX_CPU:
        raise SpecError("resources.cpu", f"must be at most {MAX_CPU:g}, got {cpu:g}")
    if cpu <= 0:
        raise SpecError("resources.cpu", f"must be positive, got {cpu:g}")
    memory = str(raw.get("memory", default_of(Resources, "memory")))
    if memory_bytes(memory) < 1:
        raise SpecError(
            "resources.memory", f"expected a Kubernetes quantity like 512Mi or 2Gi, got {memory!r}"
        )
    gpu = read_int(raw, "gpu", default_of(Resources, "gpu"), minimum=0, prefix="resources.")
    gpu_type = raw.get("gpu_type", default_of(Resources, "gpu_type"))
    if gpu_type is not None and (not isinstance(gpu_type, str) or not gpu_type):
        raise SpecError("resources.gpu_type", f"expected a GPU type name, got {gpu_type!r}")
    if gpu_type is not None and gpu == 0:
        raise SpecError("resources.gpu_type", "is set but resources.gpu is 0")
    workers = read_int(raw, "workers", default_of(Resources, "workers"), minimum=1,
                       prefix="resources.", maximum=1000)
    return Resources(cpu=cpu, memory=memory, gpu=gpu, gpu_type=gpu_type, workers=workers)


def read_promote(raw: Any) -> Promote | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError("promote", "expected a mapping with model and policy")
    no_unknown(raw, names(Promote), prefix="promote.")
    model = raw.get("model")
    if not isinstance(model, str) or not NAME_RE.match(model):
        raise SpecError(
            "promote.model",
            f"expected a model name of lowercase letters, digits and '-', got {model!r}",
        )
    policy = raw.get("policy", default_of(Promote, "policy"))
    if policy not in POLICIES:
        raise SpecError("promote.policy", f"expected one of {' | '.join(POLICIES)}, got {policy!r}")
    stage = raw.get("stage", default_of(Promote, "stage"))
    if stage not in PROMOTE_STAGES:
        raise SpecError("promote.stage",
                        f"expected one of {' | '.join(PROMOTE_STAGES)}, got {stage!r:.60}")
    return Promote(model=model, policy=policy, stage=stage,
                   constraints=read_constraints(raw.get("constraints")))


def read_constraints(raw: Any) -> dict[str, float]:
    """``promote.constraints``: metric name -> finite bound; the serving figures' short names
    (``latency_p95_ms``, ``size_mb``) are written back as their full names. Whether a name is a
    metric of the sweep is checked with the whole spec (:mod:`tuner.spec.sweep`)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("promote.constraints",
                        "expected a mapping of metric names to bounds, e.g. {latency_p95_ms: 5}")
    out: dict[str, float] = {}
    for key, bound in raw.items():
        if not isinstance(key, str) or not key:
            raise SpecError("promote.constraints", f"expected metric names, got {key!r:.60}")
        out[CONSTRAINT_ALIASES.get(key, key)] = read_number(bound, f"promote.constraints.{key}")
    return out


def read_metrics(raw: Any) -> tuple[Objective, ...]:
    """``metrics: [{name: val_accuracy, direction: maximize}, ...]`` (a bare name means
    maximize, or minimize for a serving figure); the first is the primary metric."""
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise SpecError("metrics", "expected a list of {name, direction}")
    if len(raw) > MAX_OBJECTIVES:
        raise SpecError("metrics", f"at most {MAX_OBJECTIVES} metrics, got {len(raw)}")
    out: list[Objective] = []
    for i, item in enumerate(raw):
        where = f"metrics[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping):
            raise SpecError(where, f"expected {{name, direction}}, got {item!r:.60}")
        no_unknown(item, names(Objective), prefix=f"{where}.")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"{where}.name", f"expected a non-empty string, got {name!r:.60}")
        if name in CONSTRAINT_ALIASES:
            name = CONSTRAINT_ALIASES[name]
        if any(o.name == name for o in out):
            raise SpecError(f"{where}.name", f"{name!r} is named twice")
        direction = item.get("direction", SERVING_METRICS.get(name, "maximize"))
        if direction not in DIRECTIONS:
            raise SpecError(f"{where}.direction",
                            f"expected one of {' | '.join(DIRECTIONS)}, got {direction!r:.60}")
        if name in SERVING_METRICS and direction != SERVING_METRICS[name]:
            raise SpecError(f"{where}.direction", f"{name} is a cost: it can only be minimized")
        out.append(Objective(name=name, direction=direction))
    if out[0].name in SERVING_METRICS:
        raise SpecError("metrics[0].name",
                        "the first metric is the one trials report (e.g. val_accuracy); "
                        "list the serving figures after it")
    return tuple(out)


def memory_bytes(memory: str) -> int:
    """Bytes in a Kubernetes memory quantity ("512Mi", "2G"), read with the Kubernetes client's
    parser so a spec means on one machine what it means to a cluster; 0 when it is not one.

    The import is deferred: it loads the whole client, which a notebook's first submit should
    not pay for unless it names a memory."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        return int(parse_quantity(memory))
    except ValueError:
        return 0

"""The search space of a sweep spec (``space``): one parameter type each, and its reader.

Like every value of the spec (:mod:`tuner.spec.values`), each type is a frozen dataclass whose
fields and defaults are the only statement of what it holds; its reader takes the allowed keys
and the defaults from it. :func:`read_space` refuses a bad range naming the parameter and key
(``space.lr.low: ...``), before any trial runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tuner.spec.values import SpecError, default_of, names, no_unknown, read_number

MAX_PARAM = 2.0**53  # exact in a float; a range must also have a finite width


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



def read_space(raw: Any) -> dict[str, Param]:
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError("space", "expected a non-empty mapping of parameter names to ranges")
    kinds = " | ".join(_PARAM_READERS)
    space: dict[str, Param] = {}
    for pname, pdef in raw.items():
        where = f"space.{pname}"
        if not isinstance(pname, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", pname):
            raise SpecError(where, "parameter names are letters, digits, '_', '.' and '-'")
        if not isinstance(pdef, Mapping):
            raise SpecError(where, f"expected a mapping with a type ({kinds})")
        ptype = pdef.get("type")
        reader = _PARAM_READERS.get(ptype) if isinstance(ptype, str) else None
        if reader is None:
            raise SpecError(f"{where}.type", f"expected {kinds}, got {ptype!r}")
        space[pname] = reader(pdef, where)
    return space


def _range(pdef: Mapping[str, Any], where: str, cast: type, log_default: bool
           ) -> tuple[Any, Any, bool]:
    for key in ("low", "high"):
        if key not in pdef:
            raise SpecError(f"{where}.{key}", "is required")
    low = read_number(pdef["low"], f"{where}.low")
    high = read_number(pdef["high"], f"{where}.high")
    for key, v in (("low", low), ("high", high)):
        if abs(v) > MAX_PARAM:
            raise SpecError(f"{where}.{key}", f"must be within ±2**53, got {v:g}")
    if cast is int:
        for key, v in (("low", pdef["low"]), ("high", pdef["high"])):
            if not isinstance(v, int):
                raise SpecError(f"{where}.{key}", f"expected an integer, got {v!r}")
    if low >= high:
        raise SpecError(f"{where}.low", f"must be below high (got low={low:g}, high={high:g})")
    log = pdef.get("log", log_default)
    if not isinstance(log, bool):
        raise SpecError(f"{where}.log", f"expected true or false, got {log!r}")
    if log and low <= 0:
        raise SpecError(f"{where}.low", f"a log scale needs low > 0, got {low:g}")
    return cast(pdef["low"]), cast(pdef["high"]), log


def _float_param(pdef: Mapping[str, Any], where: str) -> FloatParam:
    no_unknown(pdef, names(FloatParam), prefix=f"{where}.")
    low, high, log = _range(pdef, where, float, default_of(FloatParam, "log"))
    step = pdef.get("step", default_of(FloatParam, "step"))
    if step is not None:
        step = read_number(step, f"{where}.step")
        if step <= 0:
            raise SpecError(f"{where}.step", f"must be positive, got {step:g}")
        if log:
            raise SpecError(f"{where}.step", "cannot be combined with log: true")
        if step > high - low:
            raise SpecError(f"{where}.step", f"is larger than high - low ({high - low:g})")
    return FloatParam(low=low, high=high, log=log, step=step)


def _int_param(pdef: Mapping[str, Any], where: str) -> IntParam:
    no_unknown(pdef, names(IntParam), prefix=f"{where}.")
    low, high, log = _range(pdef, where, int, default_of(IntParam, "log"))
    every = default_of(IntParam, "step")
    step = pdef.get("step", every)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise SpecError(f"{where}.step", f"expected a positive integer, got {step!r}")
    if log and step != every:
        raise SpecError(f"{where}.step", "cannot be combined with log: true")
    return IntParam(low=low, high=high, log=log, step=step)


def _categorical_param(pdef: Mapping[str, Any], where: str) -> CategoricalParam:
    no_unknown(pdef, names(CategoricalParam), prefix=f"{where}.")
    choices = pdef.get("choices")
    if not isinstance(choices, list) or not choices:
        raise SpecError(f"{where}.choices", "expected a non-empty list")
    for c in choices:
        if not (c is None or isinstance(c, str | int | float | bool)):
            raise SpecError(f"{where}.choices", f"choices must be scalars, got {c!r}")
    if len(set(map(repr, choices))) != len(choices):
        raise SpecError(f"{where}.choices", "choices must be distinct")
    return CategoricalParam(choices=tuple(choices))


# A parameter's ``type`` -> its reader; the order is the one error messages list.
_PARAM_READERS: dict[str, Callable[[Mapping[str, Any], str], Param]] = {
    "float": _float_param,
    "int": _int_param,
    "categorical": _categorical_param,
}

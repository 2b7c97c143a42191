"""Sweep specs: the fields of a sweep (:mod:`~tuner.spec.sweep`, one declaration each), the
values inside them (:mod:`~tuner.spec.values`) and the search space (:mod:`~tuner.spec.space`)."""

from tuner.spec.sweep import (
    FIELDS,
    NAME_RE,
    OUR_PRUNER_OPTIONS,
    POLICIES,
    PRIORITIES,
    REQUIRED,
    SERVING_METRICS,
    Objective,
    Promote,
    Resources,
    SpecError,
    SweepSpec,
    dump,
    parse_duration,
)

__all__ = [
    "FIELDS",
    "NAME_RE",
    "OUR_PRUNER_OPTIONS",
    "POLICIES",
    "PRIORITIES",
    "REQUIRED",
    "SERVING_METRICS",
    "Objective",
    "Promote",
    "Resources",
    "SpecError",
    "SweepSpec",
    "dump",
    "parse_duration",
]

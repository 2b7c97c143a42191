"""A serving-cost measurement made inside a measuring pod (Kubernetes), and the tuner's reading
of its one line of result.

The pod runs ``python -m tuner.serving.cost_report MODEL_DIR --batch-size 1 ...``: the same
measurement as on one machine (:func:`tuner.serving.cost.measure`: the ``model serve`` app
pinned to one CPU, warm-up, timed requests over a Unix socket, the model's size), with the
same :class:`~tuner.serving.cost.CostMethod`, so the figures of both modes mean the same. It
prints exactly one line on stdout, ``tunehub-serving-cost {json}``: the three figures, or
``{"error": why}`` (and exits non-zero) when the model cannot be measured.

**Why the pod's log is the channel.** The tuner reads that line through the pods' log API
(``pods/log``), of the one pod of the Job it created, by name and this release's labels, and
at most :data:`LOG_BYTES` of it. Nobody else's pod can write into that log: it is the output
of this pod's own process (the measuring server's output goes to pipes of that process, not
to the log), and the pod has no network at all (its NetworkPolicy admits nothing and lets
nothing out), so no report route, token or port is there to forge or squat. The tuner takes
the line only when there is exactly one and it parses strictly (known keys, finite numbers);
anything else is "not measured" with the reason. The model itself (a program) runs in the pod
as its owner's code would; it is the owner's model and the owner's budget (their spec's
``promote.constraints``), so nobody gains by a model that fakes its own figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, fields
from pathlib import Path

from tuner.serving.cost import CostError, CostMethod

#: What begins the pod's one line of result.
PREFIX = "tunehub-serving-cost "
#: The most of the pod's log the tuner reads: the line is a few hundred bytes.
LOG_BYTES = 64 * 1024
#: The figures a measurement gives, all of them, nothing else.
FIGURES = ("model_size_mb", "serving_latency_p50_ms", "serving_latency_p95_ms")
#: Exit status of a pod that measured nothing (its line says why).
NOT_MEASURED = 3


def method_args(method: CostMethod) -> list[str]:
    """``method`` as the pod's command-line options (the inverse of :func:`main`'s parser)."""
    return [f"--{f.name.replace('_', '-')}={getattr(method, f.name)}" for f in fields(method)]


def parse_report(text: str) -> dict[str, float]:
    """The figures in a measuring pod's log ``text``, or :class:`CostError` saying why not:
    the pod's own error, or what is wrong with its output."""
    if len(text.encode()) >= LOG_BYTES:
        raise CostError(f"the measuring pod's output is over {LOG_BYTES // 1024} KiB; "
                        "its result is not taken")
    lines = [line[len(PREFIX):] for line in text.splitlines() if line.startswith(PREFIX)]
    if len(lines) != 1:
        raise CostError(f"the measuring pod's output holds {len(lines)} result lines, not one")
    try:
        answer = json.loads(lines[0])
    except ValueError:
        raise CostError("the measuring pod's result is not JSON") from None
    if isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"],
                                                                             str):
        raise CostError(answer["error"][:500])
    if not isinstance(answer, dict) or set(answer) != set(FIGURES):
        raise CostError("the measuring pod's result does not name exactly "
                        f"{', '.join(FIGURES)}")
    figures: dict[str, float] = {}
    for name in FIGURES:
        value = answer[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value) or value < 0:
            raise CostError(f"the measuring pod's {name} is not a finite number >= 0")
        figures[name] = float(value)
    return figures


def main(argv: list[str] | None = None) -> int:
    """The measuring pod's command: measure, print the one line, exit 0 (measured) or
    :data:`NOT_MEASURED`."""
    from tuner.serving.cost import ModelProcess, measure

    parser = argparse.ArgumentParser(prog="python -m tuner.serving.cost_report")
    parser.add_argument("model_dir", type=Path)
    defaults = asdict(CostMethod())
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    args = parser.parse_args(argv)
    method = CostMethod(**{name: getattr(args, name) for name in defaults})
    try:
        # A trial's environment: the pod has no platform secret, and no ServiceAccount token
        # (automountServiceAccountToken: false), which measure() checks all the same.
        figures = measure(args.model_dir, ModelProcess.of_owner(None), method)
    except (CostError, OSError) as exc:
        print(PREFIX + json.dumps({"error": str(exc)[:500]}), flush=True)
        return NOT_MEASURED
    print(PREFIX + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

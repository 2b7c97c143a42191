"""``tunehub demo``: the digits sweep end to end: trials, leaderboard, a promoted model."""

from __future__ import annotations

import argparse
import importlib.util

from tuner.backends import make_backend
from tuner.cli import context
from tuner.cli.errors import EXIT_FAILED, CliError
from tuner.cli.examples import EXAMPLES
from tuner.cli.render import console
from tuner.cli.sweep import drive
from tuner.spec import SweepSpec

EXAMPLE = EXAMPLES / "digits" / "sweep.yaml"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the digits example sweep and promote its best model")
    p.add_argument("--trials", type=int, default=None, help="override the example's trials")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if not EXAMPLE.exists():
        raise CliError(f"the digits example is missing ({EXAMPLE}); run from a source checkout")
    missing = [m for m in ("tensorflow", "sklearn") if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(f"tunehub demo trains Keras models on scikit-learn's digits (missing "
                       f"{', '.join(missing)}): pip install 'tunehub[tf]'")
    spec = SweepSpec.from_yaml(EXAMPLE)
    if args.trials is not None:
        if args.trials < 1:
            raise CliError(f"--trials must be at least 1, got {args.trials}")
        data = spec.to_dict()
        data["trials"] = args.trials
        spec = SweepSpec.from_dict(data)
    settings = context.settings()
    sweep = context.store().submit(spec, context.actor(), make_backend("local", settings))
    if not args.json:
        console.print(
            f"[bold]tunehub demo[/bold]: {spec.trials} trials of a Keras model on the digits "
            f"data, {spec.sampler} + {spec.pruner.type}, {spec.parallelism} at a time "
            f"(sweep {sweep.id}; state in {settings.home})"
        )
    code = drive(sweep.id, "local", as_json=args.json)
    if code != 0:
        return code
    view = context.store().get(sweep.id, context.actor())
    if view.model_version_id is None:
        raise CliError(f"sweep {sweep.id} registered no model: {view.reason}", EXIT_FAILED)
    if not args.json:
        model = spec.promote.model if spec.promote else "digits"
        console.print(
            f"\nmodel: {view.reason}\n"
            f"  serve it:  tunehub model serve {model}   (TensorFlow Serving REST on :8501)\n"
            f"  predict:   curl -d '{{\"instances\": [[0.0, ...64 pixels]]}}' "
            f"localhost:8501/v1/models/{model}:predict"
        )
    return 0

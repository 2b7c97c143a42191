"""``tunehub model ...``: list, show, promote, serve."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

from rich.table import Table

from tuner.cli import context
from tuner.cli.errors import CliError, repeatable
from tuner.cli.render import console, print_json
from tuner.serialize import model_version_view
from tuner.serving.registry import STAGES, Registry


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("model", help="the model registry")
    s = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)

    ls = s.add_parser("list", help="registered models")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=repeatable(cmd_list))

    show = s.add_parser("show", help="a model's versions and lineage")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(handler=repeatable(cmd_show))

    promote = s.add_parser("promote", help="move a stage to a version")
    promote.add_argument("name")
    promote.add_argument("version", type=_version)
    promote.add_argument("--stage", choices=STAGES, default="production")
    promote.add_argument("--json", action="store_true", help="machine-readable output")
    promote.set_defaults(handler=repeatable(cmd_promote))

    serve = s.add_parser(
        "serve", help="serve the production version (TensorFlow Serving REST API)"
    )
    serve.add_argument("name")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8501)
    serve.add_argument("--canary-share", type=_share, default=None, metavar="FRACTION",
                       help="release the canary gradually: this share of the production "
                            "route's requests goes to it (e.g. 0.1)")
    serve.add_argument("--canary-requests", type=_version, default=100, metavar="N",
                       help="clean canary answers after which it takes production, within "
                            "its bounds (100)")
    serve.add_argument("--canary-seconds", type=_seconds, default=None, metavar="S",
                       help="or: seconds since the canary's first request after which it "
                            "takes production, within its bounds, once it has answered one "
                            "request cleanly; whichever of requests or seconds comes first "
                            "(no time rule)")
    serve.add_argument("--canary-errors", type=_count, default=None, metavar="N",
                       help="canary errors tolerated; one more rolls it back at once (0; no "
                            "count bound when --canary-error-rate is given)")
    serve.add_argument("--canary-error-rate", type=_rate, default=None, metavar="FRACTION",
                       help="when the canary is judged (requests or seconds), its errors over "
                            "the requests it took must be within this, else it is rolled back "
                            "(e.g. 0.01; no rate bound)")
    serve.add_argument("--canary-latency-ms", type=_milliseconds, default=None, metavar="MS",
                       help="the canary's p95 latency must be within this to take production; "
                            "over it, the canary is rolled back (no bound)")
    serve.add_argument("--upstream", type=_upstream, default=None, metavar="URL",
                       help="route to this TensorFlow Serving (its REST base, e.g. "
                            "http://tunehub-serving:8501) instead of running the models here: "
                            "the production route goes to its stable label, the canary's "
                            "share to the canary, judged and moved as above (the labels follow "
                            "the registry's models.config)")
    serve.add_argument("--upstream-timeout", type=_seconds, default=30.0, metavar="S",
                       help="with --upstream: seconds to wait for its answer; a canary that "
                            "gives none is a canary error (30)")
    serve.set_defaults(handler=cmd_serve)


def _version(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"version must be a positive number, got {text!r}")
    return int(text)


def _bounded(what: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a number for which ``ok`` holds, else a message saying ``what``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_share = _bounded("a fraction in (0, 1]", lambda v: 0 < v <= 1)
_rate = _bounded("a fraction in [0, 1)", lambda v: 0 <= v < 1)
_seconds = _bounded("a positive number of seconds", lambda v: 0 < v < math.inf)
_milliseconds = _bounded("a positive number of milliseconds", lambda v: 0 < v < math.inf)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {text!r}")
    return int(text)


def _upstream(text: str) -> str:
    url = urlsplit(text)
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise argparse.ArgumentTypeError(f"expected TensorFlow Serving's REST base URL, e.g. "
                                         f"http://tunehub-serving:8501, got {text!r}")
    try:
        _ = url.port  # a port that is not a number raises here
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number in {text!r}") from None
    return text.rstrip("/")


def registry() -> Registry:
    settings = context.settings()
    return Registry(context.database(), settings.registry, settings.serving_root)


def cmd_list(args: argparse.Namespace) -> int:
    actor = context.actor()
    models = registry().list_models(owner=None if actor.admin else actor.name)
    if args.json:
        print_json(models)
        return 0
    if not models:
        console.print("no models yet: a sweep with promote: {model: NAME} registers one")
        return 0
    table = Table(title="Models")
    for col in ("model", "owner", "versions", "production", "canary", "metric"):
        table.add_column(col)
    for m in models:
        prod = "-" if m["production"] is None else (
            f"v{m['production']} ({m.get('production_value') or 0:.4g})")
        table.add_row(m["name"], m["owner"], str(m["versions"]), prod,
                      "-" if m["canary"] is None else f"v{m['canary']}", m["metric"])
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    actor = context.actor()
    versions = registry().versions(args.name, owner=None if actor.admin else actor.name)
    views = [model_version_view(v) for v in versions]
    if args.json:
        print_json(views)
        return 0
    table = Table(title=f"Model {args.name}")
    for col in ("version", "stage", "metric", "serving", "sweep", "trial", "params", "created"):
        table.add_column(col)
    for v in views:
        value = "-" if v["metric_value"] is None else f"{v['metric']}={v['metric_value']:.4g}"
        params = ", ".join(f"{k}={_short(x)}" for k, x in v["params"].items())
        table.add_row(str(v["version"]), v["stage"] or "-", value, _serving(v["metrics"]),
                      str(v["sweep_id"] or "-"),
                      str(v["trial_number"] if v["trial_number"] is not None else "-"), params,
                      (v["created_at"] or "")[:19])
    console.print(table)
    console.print(f"stored under {context.settings().registry / args.name}")
    return 0


def _serving(metrics: dict[str, float] | None) -> str:
    """The serving figures tunehub measured of a version (README: promotion under a budget)."""
    m = metrics or {}
    if "serving_latency_p95_ms" not in m:
        return "-"
    return (f"p95 {m['serving_latency_p95_ms']:.3g} ms, "
            f"{m.get('model_size_mb', float('nan')):.3g} MB")


def _short(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def cmd_promote(args: argparse.Namespace) -> int:
    actor = context.actor()
    row = registry().promote(args.name, args.version, stage=args.stage, actor=actor.name,
                             is_admin=actor.admin)
    if args.json:
        print_json(model_version_view(row))
    else:
        console.print(f"{args.name} v{args.version} is now {args.stage}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tuner.serving.server import serve

    reg = registry()
    reg.versions(args.name)
    where = f"http://{args.host}:{args.port}/v1/models/{args.name}:predict"
    if args.upstream is not None:
        console.print(f"routing {args.name} on {where} to TensorFlow Serving at "
                      f"{args.upstream} (labels stable/canary)  (Ctrl-C stops)")
    else:
        console.print(f"serving {args.name} (production; labels stable/canary) on {where}  "
                      "(Ctrl-C stops)")
    canary = None
    if args.canary_share is not None:
        from tuner.serving.canary import CanaryPolicy

        errors = args.canary_errors
        if errors is None and args.canary_error_rate is None:
            errors = 0
        canary = CanaryPolicy(share=args.canary_share, promote_after=args.canary_requests,
                              max_errors=errors, max_p95_ms=args.canary_latency_ms,
                              promote_after_seconds=args.canary_seconds,
                              max_error_rate=args.canary_error_rate)
        when = f"{args.canary_requests} clean answers"
        if args.canary_seconds is not None:
            when += f" or {args.canary_seconds:g} s, whichever comes first"
        console.print(f"canary release: {args.canary_share:g} of requests to the canary, "
                      f"production after {when}")
    # Ctrl-C stops the server now: asyncio.run's own handling cancels every task and waits for
    # them, and the interpreter joins its worker threads at exit, so a prediction still running
    # (a model loading on a busy machine) held the stop for over a minute.
    signal.signal(signal.SIGINT, _stop_now)
    try:
        asyncio.run(serve(reg, args.name, args.host, args.port, canary, args.upstream,
                          args.upstream_timeout))
    except OSError as exc:
        raise CliError(
            f"--port: cannot listen on {args.host}:{args.port}: {exc.strerror}"
        ) from None
    return 0


def _stop_now(signum: int, frame: object) -> None:
    print("tunehub: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)

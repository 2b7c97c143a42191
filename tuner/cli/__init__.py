"""``tunehub``: the command line. Every command exits non-zero with a one-line reason on bad
input; ``--json`` gives machine-readable output."""

from __future__ import annotations

import argparse
import logging
import sys

from tuner.cli.errors import CliError, run_guarded


def build_parser() -> argparse.ArgumentParser:
    from tuner.cli import demo, model, pool, sweep, up

    parser = argparse.ArgumentParser(
        prog="tunehub",
        description="A shared GPU lab: notebooks, hyperparameter sweeps, a model registry.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up.register(sub)
    demo.register(sub)
    sweep.register(sub)
    model.register(sub)
    pool.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(lambda: args.handler(args))


__all__ = ["CliError", "main"]

if __name__ == "__main__":
    sys.exit(main())

"""Turning errors into one line and an exit code, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from tuner.db.outage import DatabaseUnavailable, unreachable, waited
from tuner.errors import TunehubError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


class CliError(Exception):
    """A message for the user and the exit code that goes with it."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


Handler = Callable[[argparse.Namespace], int]


def repeatable(handler: Handler) -> Handler:
    """A command that may be run again whole: one that only reads the database (``sweep
    list``, ``model show``, ``pool``...), and one whose write changes nothing when made again
    (``sweep cancel`` of a cancelled sweep, ``model promote`` of the version holding the
    stage). While the database is unreachable it is run again with backoff, saying so once
    (``database unreachable since …, retrying``, as a controller does, for up to
    :data:`~tuner.db.outage.OUTAGE_SECONDS`), instead of exiting with one line; run again
    after a commit whose answer was lost, it finds its own effect and changes nothing. A
    command whose second run would act twice (``sweep run``) still exits with its one line."""

    def run(args: argparse.Namespace) -> int:
        return waited(handler, args)

    return run


def run_guarded(action: Callable[[], int | None]) -> int:
    try:
        return action() or 0
    except KeyboardInterrupt:
        print("tunehub: interrupted", file=sys.stderr)
        return 130
    except CliError as exc:
        print(f"tunehub: error: {exc}", file=sys.stderr)
        return exc.code
    except TunehubError as exc:
        print(f"tunehub: error: {exc}", file=sys.stderr)
        return EXIT_FAILED if isinstance(exc, DatabaseUnavailable) else EXIT_BAD_INPUT
    except Exception as exc:
        if not unreachable(exc):
            raise
        # Waited out where waiting is right (a sweep's controller, a command that only
        # reads); a command that writes and finds the database away says so in one line.
        print("tunehub: error: database unreachable; try again shortly", file=sys.stderr)
        return EXIT_FAILED

"""Runs a Python function shipped from a notebook (cloudpickle) as a trial.

:data:`COMMAND` (``python -m tuner.sdk.run_function objective.pkl``): the function gets the trial's
parameters; a number it returns is reported as the trial's result, a mapping of metric names to
numbers as its final report of every metric (a multi-objective sweep's ``metrics``). It may call
``tuner.report(value, step)`` itself to be pruned.

The client (:meth:`tuner.sdk.client.Sweep.submit`) and the API (``POST sweeps`` with a
``function``) both take the command from here, so the command a notebook sends is the one the
service accepts. Every backend then runs it like any other command: the local backend directly or
forked warm (``python -m`` is what :func:`tuner.backends.local.warm.warm_argv` accepts), the
Kubernetes backend in the trial image, whose ``python`` has the tunehub package installed.
This module imports nothing heavy at the top: the notebook client imports it for the constants.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The file the shipped function is stored as, in the sweep's code snapshot.
FUNCTION_FILE = "objective.pkl"
#: The command every trial of a function sweep runs.
COMMAND = f"python -m tuner.sdk.run_function {FUNCTION_FILE}"


def main(argv: list[str]) -> int:
    import cloudpickle

    import tuner

    if len(argv) != 1:
        print("usage: python -m tuner.sdk.run_function FILE", file=sys.stderr)
        return 2
    function = cloudpickle.loads(Path(argv[0]).read_bytes())
    result = function(tuner.params())
    if isinstance(result, dict):
        tuner.report({str(k): float(v) for k, v in result.items()})
    elif result is not None:
        tuner.report(float(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

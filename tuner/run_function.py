"""Runs a Python function shipped from a notebook (cloudpickle) as a trial.

``python -m tuner.run_function objective.pkl``: the function gets the trial's parameters; a
number it returns is reported as the trial's result. It may call ``tuner.report(value, step)``
itself to be pruned.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import cloudpickle

    import tuner

    if len(argv) != 1:
        print("usage: python -m tuner.run_function FILE", file=sys.stderr)
        return 2
    function = cloudpickle.loads(Path(argv[0]).read_bytes())
    result = function(tuner.params())
    if result is not None:
        tuner.report(float(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

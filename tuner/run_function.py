"""The entry point function sweeps stored before the SDK had its own package
(``python -m tuner.run_function objective.pkl``): a sweep submitted then and resumed now still
runs its trials. New sweeps store :data:`tuner.sdk.run_function.COMMAND`."""

from __future__ import annotations

import sys

from tuner.sdk.run_function import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

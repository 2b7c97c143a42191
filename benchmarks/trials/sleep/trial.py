"""The overhead benchmark's trial: sleep, then report a trivial score (the same objective the
peers run)."""

import os
import time

import tuner

params = tuner.params()
time.sleep(float(os.environ.get("BENCH_SLEEP", "0.2")))
tuner.report(1.0 - (float(params["x"]) - 0.3) ** 2)

"""The start-latency benchmark's trial: the moment user code runs with TensorFlow imported
(written to ``ran-<trial id>`` in ``BENCH_MARKS``), then a clean Keras session and a report."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow  # noqa: E402, F401

import tuner  # noqa: E402

ran = time.time()
marks = os.environ["BENCH_MARKS"]
with open(os.path.join(marks, f"ran-{os.environ['TUNEHUB_TRIAL_ID']}"), "w") as fh:
    fh.write(repr(ran))
keras.backend.clear_session()
tuner.report(float(tuner.params()["x"]))

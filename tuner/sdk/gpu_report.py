"""Inside a Kubernetes trial pod that asked for GPUs: measure them and report to the tuner.

Why in the pod: the tuner cannot read NVML on another node, and only the pod sees its own GPUs
(its container runtime exposes exactly those). The trial's Job runs
``python -m tuner.sdk.gpu_report $$ &`` before the trial's command
(:func:`tuner.backends.kubernetes.manifests.job`): this loop reads every GPU NVML shows with the
platform's sampler (:mod:`tunehub_base.gpu_usage`) every ``TUNEHUB_GPU_SAMPLE_SECONDS`` and
posts the readings to ``trials/<id>/gpu-use`` with the trial's token, the channel its results
take. It ends with the trial's shell (the pid given), or when the tuner refuses the token (the
attempt ended). It never fails the trial: without NVML it sends the reason once and stops.
"""

from __future__ import annotations

import os
import sys
import time

from tunehub_base.gpu_meter import number_setting
from tunehub_base.gpu_usage import Sampler, absent, nvml_gpus
from tuner.sdk.training import ENV_ATTEMPT, ENV_TRIAL_ID, _post


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    watched = int(argv[1]) if len(argv) > 1 else os.getppid()
    path = f"trials/{os.environ[ENV_TRIAL_ID]}/gpu-use"
    attempt = int(os.environ.get(ENV_ATTEMPT, "1"))
    interval = max(0.2, number_setting("TUNEHUB_GPU_SAMPLE_SECONDS"))
    gpus = nvml_gpus()
    sampler = Sampler()
    while alive(watched):
        if gpus is None:
            readings = sampler.sample(["0"])  # says why NVML cannot be read
        elif not gpus:
            readings = absent(["0"], "no GPU visible to NVML in this pod")
        else:
            readings = sampler.sample(gpus)
        try:
            _post(path, {"attempt": attempt,
                         "readings": [r.to_json() for r in readings.values()]})
        except RuntimeError as exc:  # refused: the attempt is over
            print(f"tunehub: GPU use no longer reported: {exc}", file=sys.stderr)
            return 0
        if not gpus:
            return 0  # the reason is sent; nothing will change
        time.sleep(interval)  # the sampling period
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

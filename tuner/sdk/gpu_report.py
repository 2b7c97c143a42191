"""Inside a Kubernetes trial pod that asked for GPUs: measure them and report to the tuner.

Why in the pod: the tuner cannot read NVML on another node, and only the pod sees its own GPUs
(its container runtime exposes exactly those). The trial's Job runs
``python -m tuner.sdk.gpu_report $$ &`` before the trial's command
(:func:`tuner.backends.kubernetes.manifests.job`): this loop reads every GPU NVML shows with the
platform's sampler (:mod:`tunehub_base.gpu_usage`) every ``TUNEHUB_GPU_SAMPLE_SECONDS`` and
posts the readings to ``trials/<id>/gpu-use`` with the trial's token, the channel its results
take. It ends with the trial's shell (the pid given), or when the tuner refuses the token (the
attempt ended). It never fails the trial nor holds up its pod: one try per reading, silent;
without NVML it sends the reason once and stops.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tunehub_base.gpu_meter import number_setting
from tunehub_base.gpu_usage import Sampler, absent, nvml_gpus
from tunehub_base.tls import api_context
from tuner.sdk.training import (
    ENV_API_SOCKET,
    ENV_API_URL,
    ENV_ATTEMPT,
    ENV_TOKEN,
    ENV_TRIAL_ID,
    _sender,
    _TransportError,
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def post(path: str, body: dict[str, Any]) -> int | None:
    """One try (a reading lost is replaced by the next; a trial's results, not this, are
    what the SDK retries): the HTTP status, or None when the tuner was not reached."""
    url = os.environ[ENV_API_URL].rstrip("/") + "/api/v1/" + path
    headers = {"Content-Type": "application/json",
               "Authorization": f"Bearer {os.environ.get(ENV_TOKEN, '')}"}
    send = _sender(os.environ.get(ENV_API_SOCKET), api_context())
    try:
        return send(url, json.dumps(body).encode(), headers)[0]
    except (OSError, TimeoutError, _TransportError):
        return None


def main(argv: list[str]) -> int:
    watched = int(argv[1]) if len(argv) > 1 else os.getppid()
    if not (os.environ.get(ENV_TRIAL_ID) and os.environ.get(ENV_API_URL)):
        return 0  # not a tunehub trial: nobody to report to
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
        status = post(path, {"attempt": attempt,
                             "readings": [r.to_json() for r in readings.values()]})
        if status is not None and 400 <= status < 500:  # refused: the attempt is over
            return 0
        if not gpus:
            return 0  # the reason is sent; nothing will change
        time.sleep(interval)  # the sampling period
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

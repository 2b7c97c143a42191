"""Multi-worker trials on one machine: the cluster a ``workers: N`` trial's processes form.

TensorFlow's ``MultiWorkerMirroredStrategy`` reads its peers from ``TF_CONFIG``; every worker's
gRPC server binds its port on all interfaces, so on one machine the workers need distinct ports,
not distinct addresses. Worker 0 is the chief: it reports to the sweep and its export is the
trial's model (:func:`tuner.sdk.training.is_chief`), as in the Kubernetes backend's Indexed Job.
"""

from __future__ import annotations

import json

#: How long the other workers get to exit on their own once the chief has exited 0 (they end
#: their last collective with it), before they are stopped like a Job's lingering pods.
SIBLING_GRACE_SECONDS = 10.0


def tf_config(hosts: list[str], index: int) -> str:
    """``TF_CONFIG`` of worker ``index`` in a cluster of ``hosts`` (``host:port``)."""
    return json.dumps(
        {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}},
        separators=(",", ":"),
    )

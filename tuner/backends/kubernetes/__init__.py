"""The Kubernetes backend: each trial attempt is a ``batch/v1`` Job on a shared GPU pool.

- :mod:`.settings`: ``TUNEHUB_K8S_*`` configuration (namespace, image, data claim, GPU types,
  priority classes, Kueue queue, per-user caps).
- :mod:`.manifests`: the Job / token Secret / headless Service of one attempt, as plain dicts.
- :mod:`.status`: what Job and pod statuses mean for the attempt, in readable reasons.
- :mod:`.api`: the few kubernetes-asyncio calls, speaking JSON.
- :mod:`.checks`: refusing, at submission, sweeps whose trials could never run.
- :mod:`.backend`: :class:`KubernetesBackend`, watching Jobs and pods and emitting events.
"""

from tuner.backends.kubernetes.backend import KubernetesBackend
from tuner.backends.kubernetes.settings import GpuType, KubeSettings

__all__ = ["GpuType", "KubeSettings", "KubernetesBackend"]

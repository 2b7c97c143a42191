"""Pool views per mode (see :mod:`._base`): :class:`LocalPoolSource` for one machine,
:class:`KubernetesPoolSource` for a cluster (imported on demand: it needs the Kubernetes
client)."""

from tuner.pool_sources._base import PoolSource
from tuner.pool_sources.local import LocalPoolSource

__all__ = ["LocalPoolSource", "PoolSource"]

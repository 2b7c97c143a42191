"""The emulator's own tests use its fixtures (``kubesim.fixtures``) directly."""

from kubesim.fixtures import kube, kube_nodes  # noqa: F401  (pytest finds fixtures by name)

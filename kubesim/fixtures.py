"""pytest fixtures for the emulated cluster (registered via ``pytest_plugins``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import KubeCluster, default_nodes
from .nodes import FakeNode


@pytest.fixture
def kube_nodes() -> list[FakeNode]:
    """The fake nodes of the ``kube`` cluster; override this fixture to change the pool."""
    return default_nodes()


@pytest.fixture
def kube(tmp_path: Path, kube_nodes: list[FakeNode]) -> Iterator[KubeCluster]:
    """A running emulated cluster with namespace ``tunehub``; the ``tunehub-data`` claim maps
    to ``tmp_path / "kube-data"`` unless the test calls ``kube.map_claim``."""
    cluster = KubeCluster(tmp_path / "kube", nodes=kube_nodes, data_dir=tmp_path / "kube-data")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

"""Reading TensorFlow Serving's model config the way TensorFlow Serving does."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig


def served(path: Path) -> dict[str, dict]:
    """``{model: {"base_path", "versions", "labels"}}`` as TensorFlow Serving reads the file."""
    config = text_format.Parse(path.read_text(), ModelServerConfig())
    assert config.WhichOneof("config") == "model_config_list"
    out = {}
    for m in config.model_config_list.config:
        assert m.model_platform == "tensorflow"
        assert m.model_version_policy.WhichOneof("policy_choice") == "specific"
        out[m.name] = {"base_path": m.base_path,
                       "versions": sorted(m.model_version_policy.specific.versions),
                       "labels": dict(m.version_labels)}
    return out

"""The measured GPU use of Kubernetes trial pods, kept by the tuner for ``sweep show``.

On one machine the tuner measures its trials' GPUs itself and keeps the figures in the GPUs'
holder records (:mod:`tunehub_base.gpu_holders`). A pod's GPUs are on a node the tuner cannot
read: the pod measures them with the same sampler (:mod:`tuner.sdk.gpu_report`) and reports
each reading with its trial's token; the tuner sums them per attempt and GPU
(:class:`tunehub_base.gpu_meter.UseMeter`) and keeps them here, one file per sweep in the
tuner's own directory (``$TUNEHUB_HOME/gpu-locks/pod-use``, :mod:`tunehub_base.private_json`),
as spans shaped like the holder ledger's, so :func:`tuner.pool_view.trials_gpu_use` reads both
the same way.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tunehub_base.private_json import read_json, write_json

SUBDIR = "pod-use"
MAX_SPANS = 20_000  # per sweep: (trial, attempt, GPU) triples


class PodUseBook:
    """Spans ``{kind, sweep_id, trial, attempt, gpu, start, end, use}`` per sweep."""

    _lock = threading.Lock()  # one writer at a time in this process

    def __init__(self, lock_dir: Path) -> None:
        self.directory = Path(lock_dir) / SUBDIR

    @staticmethod
    def _name(sweep_id: int) -> str:
        return f"sweep-{int(sweep_id)}.json"

    def spans(self, sweep_id: int) -> list[dict[str, Any]]:
        data = read_json(self.directory, self._name(sweep_id))
        spans = data.get("spans") if isinstance(data, dict) else None
        return [s for s in spans if isinstance(s, dict)] if isinstance(spans, list) else []

    def keep(self, sweep_id: int, span: dict[str, Any]) -> None:
        """Replace the span of the same trial, attempt and GPU (or add it)."""
        key = (span["trial"], span["attempt"], span["gpu"])
        with self._lock:
            spans = [s for s in self.spans(sweep_id)
                     if (s.get("trial"), s.get("attempt"), s.get("gpu")) != key]
            spans.append({**span, "kind": "trial", "sweep_id": sweep_id})
            write_json(self.directory, self._name(sweep_id), {"spans": spans[-MAX_SPANS:]})

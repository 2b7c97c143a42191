"""What serving a digits MLP costs as it widens, measured the way tunehub measures every saved
model of a sweep with a serving budget (issue 27, :mod:`tuner.serving.cost`): served by the
``tunehub model serve`` app in a child pinned to one CPU with TensorFlow's thread pools at 1,
20 warm-up requests, then timed requests from the client side over loopback. The widths span
the test's search space (``tests/test_promotion_budget.py``): width buys accuracy and costs
latency and size. Untrained weights: serving cost does not depend on their values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, RunContext

WIDTHS = (2, 32, 256, 1024)
BATCHES = (1, 32)


def _export(width: int, target: Path) -> None:
    import keras

    from tuner.sdk.training import _export as export

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,), name="pixels"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    export(model, target)


class ServingCostBenchmark(Benchmark):
    name = "serving_cost"
    title = "Serving cost of a model, as promotion under a budget measures it (issue 27)"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from tuner.serving.cost import CostMethod, ModelProcess, measure

        requests = ctx.size("requests", 50, 200)
        rows = []
        for width in WIDTHS:
            target = ctx.scratch / f"mlp-{width}"
            _export(width, target)
            for batch in BATCHES:
                method = CostMethod(batch_size=batch, requests=requests)
                ctx.log(f"width {width}, batch {batch}")
                figures = measure(target, ModelProcess.of_owner(None), method)
                rows.append({"width": width, "batch": batch, **figures})
        return {"requests": requests, "rows": rows,
                "method": CostMethod(requests=requests).describe()}

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            f"Method: {result['method']} (batch as in the table); a shared machine, the pinned "
            "CPU not reserved from other work. Two hidden layers of the given width on the "
            "64 digits pixels.",
            "",
            "| width | batch | p50 | p95 | size on disk |",
            "|---|---|---|---|---|",
        ]
        for r in result["rows"]:
            lines.append(f"| {r['width']} | {r['batch']} | {r['serving_latency_p50_ms']:.2f} ms | "
                         f"{r['serving_latency_p95_ms']:.2f} ms | {r['model_size_mb']:.3f} MB |")
        return "\n".join(lines)

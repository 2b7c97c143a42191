"""placeholder"""

from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext


class HubBenchmark(Benchmark):
    name = "hub"
    title = "hub"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        raise NotMeasured("not written yet")

    def render(self, result: dict[str, Any]) -> str:
        return ""

"""tunehub's side-by-side benchmarks: ``python -m benchmarks`` (``make bench``).

Each benchmark runs tunehub and its peers on the same workload in the same run and writes raw
numbers to ``benchmarks/results.json``; ``benchmarks/RESULTS.md`` is rendered from them.
"""

from __future__ import annotations

from benchmarks._base import Benchmark, RunContext


def all_benchmarks() -> list[Benchmark]:
    """Every benchmark, in the order they run and appear in RESULTS.md."""
    from benchmarks.digits import DigitsBenchmark
    from benchmarks.faults import FaultsBenchmark
    from benchmarks.hub import HubBenchmark
    from benchmarks.hub_scale import HubScaleBenchmark
    from benchmarks.kubernetes import KubernetesBenchmark
    from benchmarks.overhead import OverheadBenchmark
    from benchmarks.pool import PoolBenchmark
    from benchmarks.reports import ReportsBenchmark
    from benchmarks.resume import ResumeBenchmark
    from benchmarks.scale import ScaleBenchmark
    from benchmarks.search import SearchBenchmark
    from benchmarks.serving_cost import ServingCostBenchmark
    from benchmarks.start_latency import StartLatencyBenchmark
    from benchmarks.tpe_view import TpeViewBenchmark
    from benchmarks.warm_imports import WarmImportsBenchmark

    return [
        OverheadBenchmark(),
        ScaleBenchmark(),
        ReportsBenchmark(),
        ResumeBenchmark(),
        TpeViewBenchmark(),
        DigitsBenchmark(),
        SearchBenchmark(),
        StartLatencyBenchmark(),
        WarmImportsBenchmark(),
        KubernetesBenchmark(),
        HubBenchmark(),
        HubScaleBenchmark(),
        PoolBenchmark(),
        FaultsBenchmark(),
        ServingCostBenchmark(),
    ]


__all__ = ["Benchmark", "RunContext", "all_benchmarks"]

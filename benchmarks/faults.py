"""Faults survived (issue 29): each fault test of the suite run against the real parts, its own
measurement kept as a row of the "Faults" table: the fault, how long it lasted, what was in
flight, what was lost (target 0), how long recovery took and what the person saw.

The tests are the measurement (no second copy of each scenario to drift from them): pytest runs
each with ``TUNEHUB_FAULT_RECORDS`` naming a file, and each test appends its row there
(:mod:`tests.fault_records`) once all its assertions held. A test that fails leaves no row; its
file is named instead, with its last lines.

Size: ``faults_outage_s`` (default: each test's own, 15 s) is how long the database outage
tests keep their PostgreSQL down (``TUNEHUB_FAULT_OUTAGE_S``). Issue 29's longer figure, a
5-minute outage, is measured once with ``python -m benchmarks faults --set
faults_outage_s=300`` (about 6 minutes per outage test; too slow for the suite).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO

#: The fault tests, in the order of the table.
TESTS = (
    "tests/test_database_outage.py::test_postgres_crash_mid_sweep_loses_nothing",
    "tests/test_database_outage.py::test_postgres_crash_mid_service_sweep_loses_nothing",
    "tests/test_lost_commit.py",
    "tests/test_faults_startup.py",
    "tests/test_faults_tuner_killed.py",
    "tests/test_faults_hub_restart.py",
    "tests/test_faults_disk_full.py",
    "tests/test_faults_kubernetes.py",
)
TEST_TIMEOUT_S = 1500


class FaultsBenchmark(Benchmark):
    name = "faults"
    title = "Faults"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        failed: list[dict[str, str]] = []
        outage = ctx.options.get("faults_outage_s")
        # (tests/fault_records.py reads it; unset, each test keeps its own length)
        extra = {"TUNEHUB_FAULT_OUTAGE_S": str(int(outage))} if outage is not None else {}
        for test in TESTS:
            with tempfile.NamedTemporaryFile("r", suffix=".jsonl", dir=ctx.scratch) as out:
                ctx.log(f"faults: {test}")
                began = time.monotonic()
                env = {**os.environ, **extra, "TUNEHUB_FAULT_RECORDS": out.name,
                       "PYTHONPATH": os.pathsep.join(filter(None, [
                           str(REPO), os.environ.get("PYTHONPATH")]))}
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
                found = [json.loads(line) for line in out.read().splitlines() if line.strip()]
                for row in found:
                    row["test"] = test
                    row["test_s"] = round(time.monotonic() - began, 1)
                rows += found
                if done.returncode != 0 or not found:
                    failed.append({"test": test, "tail": done.stdout[-1500:]})
        if not rows:
            raise NotMeasured("no fault test passed: " + "; ".join(f["test"] for f in failed))
        return {"rows": rows, "failed": failed}

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        lost = sum(r["lost"] for r in result["rows"])
        return [("every fault survived: nothing lost, every fault test passes",
                 f"{len(result['rows'])} faults, {lost} trials or results lost, "
                 f"{len(result['failed'])} tests failed",
                 lost == 0 and not result["failed"])]

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            "Each row is one fault test of the suite against the real parts (its own "
            "PostgreSQL crashed and restarted, real `tunehub up`, a real small filesystem, "
            "the Kubernetes emulator's fault injection over HTTP), measured by the test "
            "itself once all its assertions held (`tests/fault_records.py`). *Duration*: how "
            "long the part was away (for the Kubernetes row: the whole sweep through the "
            "faults). *Recover*: from the part's return until work went on.",
            "",
            "| fault | duration | sweeps / trials in flight (running) | lost | time to "
            "recover | what the person saw |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["rows"]:
            lines.append(
                f"| {r['fault']} | {r['duration_s']:.1f} s | {r['sweeps']} / {r['trials']} "
                f"({r['running']}) | {r['lost']} | {r['recover_s']:.1f} s | {r['seen']} |")
        for f in result["failed"]:
            lines.append(f"| `{f['test']}` failed | – | – | – | – | see its output |")
        return "\n".join(lines) + "\n"

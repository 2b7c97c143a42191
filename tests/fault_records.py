"""What a fault test measured, for the "Faults" table in ``benchmarks/RESULTS.md``.

A fault test asserts; the figures it measured on the way (how long the fault lasted, what was
in flight, what was lost, how long recovery took, what the person saw) are the table's rows.
With ``TUNEHUB_FAULT_RECORDS`` set to a file (``python -m benchmarks faults`` sets it), each
test appends its row there as one JSON line; without it nothing is written: a test run leaves
no files behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

ENV = "TUNEHUB_FAULT_RECORDS"
#: How long the database outage tests keep their PostgreSQL down, in seconds, when set
#: (``python -m benchmarks faults --set faults_outage_s=300`` measures a 5-minute outage once;
#: the suite keeps each test's own short default).
OUTAGE_ENV = "TUNEHUB_FAULT_OUTAGE_S"


@dataclass
class FaultRecord:
    fault: str
    duration_s: float  # how long the fault lasted (the part was away)
    sweeps: int  # sweeps in flight
    trials: int  # trials in the sweeps
    running: int  # trials running when the fault struck
    lost: int  # trials or results lost (target 0)
    recover_s: float  # from the end of the fault to work going on again
    seen: str  # what the person saw


def outage_seconds(default: float) -> float:
    """How long a database outage test keeps its database down: ``TUNEHUB_FAULT_OUTAGE_S``
    when set, else ``default``."""
    value = os.environ.get(OUTAGE_ENV)
    return float(value) if value else default


def record(row: FaultRecord) -> None:
    """Append ``row`` to the file named by ``TUNEHUB_FAULT_RECORDS``, if set."""
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(asdict(row)) + "\n")

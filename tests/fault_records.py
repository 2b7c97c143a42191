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


def record(row: FaultRecord) -> None:
    """Append ``row`` to the file named by ``TUNEHUB_FAULT_RECORDS``, if set."""
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(asdict(row)) + "\n")

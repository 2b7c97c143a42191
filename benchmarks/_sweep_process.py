"""``python -m benchmarks._sweep_process HOME DB_URL TRIALS [--resume SWEEP_ID]``: the scale
benchmark's sweep (instant backend, TPE with ASHA) driven by a process of its own, so the
resume benchmark can SIGKILL it like an operator's ``kill -9`` or an OOM kill would.

Prints one JSON line as soon as the sweep is claimed (``{"sweep_id": N}``), and one when it
ends (``{"state": ..., "wall_s": ...}``). ``--resume``: claim the existing sweep instead of
submitting one, as ``tunehub sweep resume`` does (a new engine's ``run_sweep``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def drive(home: Path, url: str, trials: int, steps: int, resume: int | None) -> None:
    from benchmarks._tunehub import ACTOR, in_process_engine, settings_for
    from benchmarks.scale import scale_spec
    from tuner.backends.instant import InstantBackend
    from tuner.db import Database
    from tuner.spec import SweepSpec
    from tuner.sweep_store import SweepStore

    settings = settings_for(home, url)
    db = Database(url)
    backend = InstantBackend(steps)
    async with in_process_engine(settings, db, backend) as engine:
        if resume is None:
            spec = SweepSpec.from_dict(scale_spec(trials, steps))
            sweep_id = SweepStore(db, settings).submit(spec, ACTOR, backend).id
        else:
            sweep_id = resume
        started = time.perf_counter()
        task = engine.run_sweep(sweep_id)
        _say(sweep_id=sweep_id)
        state = await task
        _say(state=str(state), wall_s=time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks._sweep_process")
    p.add_argument("home", type=Path)
    p.add_argument("url")
    p.add_argument("trials", type=int)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--resume", type=int, default=None, metavar="SWEEP_ID")
    a = p.parse_args()
    asyncio.run(drive(a.home, a.url, a.trials, a.steps, a.resume))


if __name__ == "__main__":
    main()

"""What a warm start saves a scikit-learn trial, pruned and not (issue 28).

A script importing scikit-learn but not TensorFlow used to be forked from a process that had
preloaded only ``tuner``: every trial imported scikit-learn itself, so a trial stopped after one
epoch cost nearly as much as a full one. The preload now follows the import graph
(``tuner/backends/local/warm.py``). Measured through the local backend, launch to exit, with the
spec's ``preload: none`` (what such a script got before) against ``auto``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, RunContext
from benchmarks._common import ms, ratio, summary

TRAIN = """
import os
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier
from sklearn.model_selection import train_test_split

x, y = load_digits(return_X_y=True)
xt, xv, yt, yv = train_test_split(x, y, test_size=0.25, random_state=0)
model = SGDClassifier(random_state=0)
for epoch in range(int(os.environ["EPOCHS"])):
    model.partial_fit(xt, yt, classes=np.arange(10))
    model.score(xv, yv)
"""
FULL_EPOCHS = 27  # a full trial; a pruned one stops after its first epoch


async def _trials(scratch: Path, preload: str, epochs: int, n: int) -> dict[str, Any]:
    """``n`` trials after one that starts the warm process; each one's launch-to-exit time,
    and what it imported after its fork."""
    from tuner.backends import TrialEvent, TrialLaunch
    from tuner.backends.local import LocalBackend
    from tuner.spec import Resources

    backend = LocalBackend(scratch / "locks", gpu_ids=[], warm=True)
    events: asyncio.Queue[TrialEvent] = asyncio.Queue()
    backend.subscribe(events.put)
    walls: list[float] = []
    late: tuple[str, ...] | None = None
    try:
        for i in range(n + 1):
            workdir = scratch / f"{preload}-{epochs}-{i}"
            workdir.mkdir(parents=True)
            (workdir / "train.py").write_text(TRAIN)
            began = time.perf_counter()
            await backend.launch(TrialLaunch(
                sweep_id=1, trial_id=i + 1, number=i, attempt=1, command="python train.py",
                workdir=workdir, env={"EPOCHS": str(epochs)}, resources=Resources(),
                timeout=600, log_path=workdir / "trial.log", preload=preload))
            while not (event := await events.get()).final:
                pass
            if event.kind != "succeeded":
                raise RuntimeError(f"{preload}/{epochs}: {event.reason}")
            if i:  # the first also starts the warm process
                walls.append(time.perf_counter() - began)
            late = event.imported_after_start
    finally:
        await backend.close()
    return {"wall": summary(walls), "raw": walls, "late": list(late or ())}


class WarmImportsBenchmark(Benchmark):
    name = "warm_imports"
    title = "Warm starts of a scikit-learn trial"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        n = ctx.size("warm_imports_trials", 2, 7)
        result: dict[str, Any] = {"trials": n, "epochs": FULL_EPOCHS, "modes": {}}
        for preload in ("none", "auto"):
            for epochs in (1, FULL_EPOCHS):
                ctx.log(f"warm_imports: preload {preload}, {epochs} epoch(s), {n} trials")
                result["modes"][f"{preload}/{epochs}"] = asyncio.run(
                    _trials(ctx.scratch / "warm_imports", preload, epochs, n))
        return result

    def _p50(self, result: dict[str, Any], key: str) -> float | None:
        return result["modes"].get(key, {}).get("wall", {}).get("p50")

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        full, pruned = self._p50(result, f"auto/{FULL_EPOCHS}"), self._p50(result, "auto/1")
        before_full = self._p50(result, f"none/{FULL_EPOCHS}")
        before_pruned = self._p50(result, "none/1")
        if full is None or pruned is None:
            return []
        return [("a pruned scikit-learn trial costs a fraction of a full one (issue 28)",
                 f"pruned {ms(pruned)} vs full {ms(full)} (before: {ms(before_pruned)} vs "
                 f"{ms(before_full)}); no import after the fork: "
                 f"{not result['modes'][f'auto/{FULL_EPOCHS}']['late']}", pruned < full / 2)]

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            f"{result['trials']} trials per row, one at a time, after one that starts the warm "
            "process: a scikit-learn `SGDClassifier` on digits, one epoch (a trial pruned at its "
            f"first report) or {result['epochs']}, launch to exit through the local backend. "
            "`preload: none` preloads only `tuner`, what a script importing scikit-learn but "
            "not TensorFlow got before issue 28; `auto` follows the import graph.",
            "",
            "| preload | epochs | p50 | p95 | imported after the fork | p50 / full |",
            "|---|---|---|---|---|---|",
        ]
        for preload in ("none", "auto"):
            full = self._p50(result, f"{preload}/{result['epochs']}")
            for epochs in (1, result["epochs"]):
                d = result["modes"].get(f"{preload}/{epochs}")
                if not d:
                    continue
                late = ", ".join(d["late"]) or "nothing"
                lines.append(f"| {preload} | {epochs} | {ms(d['wall'].get('p50'))} | "
                             f"{ms(d['wall'].get('p95'))} | {late} | "
                             f"{ratio(d['wall'].get('p50'), full)} |")
        return "\n".join(lines)

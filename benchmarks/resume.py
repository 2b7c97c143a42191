"""Resume at scale: the scale benchmark's 10,000-trial sweep, its controller process killed
with SIGKILL half-way, then resumed by a new process; the sweep must still count exactly
10,000 trials, each number once, every one finished, Optuna agreeing, no result lost.

``tests/test_resume.py`` pins the kill windows one by one on 8 trials; this is the same
promise where a lost or doubled trial would hide among thousands, with the kill landing
wherever the controller happens to be (asking ahead in a thread, writing a finished trial,
telling Optuna).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, RunContext
from benchmarks._common import REPO, database_url, secs, tunehub_env

FULL_TRIALS = 10_000
QUICK_TRIALS = 300
POLL_S = 0.2  # how often the parent counts finished trials while waiting to kill


class SweepProcess:
    """``benchmarks._sweep_process`` as a child: its first line names the sweep."""

    def __init__(self, home: Path, url: str, trials: int, resume: int | None = None) -> None:
        argv = [sys.executable, "-m", "benchmarks._sweep_process", str(home), url, str(trials)]
        if resume is not None:
            argv += ["--resume", str(resume)]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=tunehub_env(home, url), stdout=subprocess.PIPE, text=True,
        )
        self.sweep_id = int(self._line()["sweep_id"])

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"sweep process exited with {code} before saying anything")
        return dict(json.loads(line))

    def kill(self) -> float:
        """SIGKILL, then reap; returns the seconds it ran."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return time.perf_counter() - self.started

    def finish(self) -> dict[str, Any]:
        end = self._line()
        if self.proc.wait() != 0:
            raise RuntimeError(f"sweep process exited with {self.proc.returncode}")
        return end


def wait_until_finished(url: str, sweep: SweepProcess, count: int) -> None:
    """Poll (one connection, every ``POLL_S``) until ``count`` of the sweep's trials have
    finished; fails if the sweep process ends first."""
    from sqlalchemy import create_engine, func, select

    from tuner.db import Trial
    from tuner.lifecycle.states import TrialState

    query = select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep.sweep_id, Trial.state.in_(TrialState.finished()))
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            while conn.execute(query).scalar_one() < count:
                conn.rollback()  # a fresh snapshot on the next look
                if sweep.proc.poll() is not None:
                    raise RuntimeError("the sweep ended before it could be killed")
                time.sleep(POLL_S)
    finally:
        engine.dispose()


def audit(url: str, sweep_id: int) -> dict[str, Any]:
    """Our rows and Optuna's trials of the sweep, counted and compared number by number."""
    import optuna
    from sqlalchemy import select

    from tuner.db import Database, SweepRow, Trial

    db = Database(url, migrate=False)
    try:
        with db.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            assert sweep is not None
            rows = [(t.number, str(t.state), t.value, t.attempts)
                    for t in s.scalars(select(Trial).where(Trial.sweep_id == sweep_id))]
            study_name, sweep_state = sweep.study_name, str(sweep.state)
    finally:
        db.dispose()
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
        theirs = {t.number: (t.state.name, t.value)
                  for t in study.get_trials(deepcopy=False)}
    finally:
        storage.engine.dispose()
    expected_optuna = {"completed": "COMPLETE", "pruned": "PRUNED", "failed": "FAIL"}
    disagree = sum(
        1 for number, state, value, _ in rows
        if theirs.get(number, ("missing", None))[0] != expected_optuna.get(state, "?")
        or (state == "completed" and theirs[number][1] != value)
    )
    return {
        "sweep_state": sweep_state,
        "rows": len(rows),
        "distinct_numbers": len({r[0] for r in rows}),
        "numbers_min": min((r[0] for r in rows), default=None),
        "numbers_max": max((r[0] for r in rows), default=None),
        "states": dict(collections.Counter(r[1] for r in rows)),
        "rerun": sum(1 for r in rows if r[3] > 1),
        "optuna_trials": len(theirs),
        "optuna_states": dict(collections.Counter(v[0] for v in theirs.values())),
        "disagree_with_optuna": disagree,
        "completed_values": {r[0]: r[2] for r in rows if r[1] == "completed"},
    }


def run_one(home: Path, url: str, trials: int, kill_at: int, log: Any) -> dict[str, Any]:
    first = SweepProcess(home, url, trials)
    wait_until_finished(url, first, kill_at)
    ran = first.kill()
    at_kill = audit(url, first.sweep_id)
    log(f"resume: killed after {ran:.0f} s with {at_kill['states']} "
        f"(Optuna {at_kill['optuna_states']})")
    resumed = SweepProcess(home, url, trials, resume=first.sweep_id)
    end = resumed.finish()
    after = audit(url, first.sweep_id)
    before_values = at_kill.pop("completed_values")
    after_values = after.pop("completed_values")
    lost = sum(1 for n, v in before_values.items() if after_values.get(n) != v)
    return {
        "trials": trials,
        "killed_after_s": ran,
        "at_kill": at_kill,
        "resumed_wall_s": end["wall_s"],
        "resumed_state": end["state"],
        "after": after,
        "completed_before_kill": len(before_values),
        "completed_results_lost": lost,
    }


def exact(entry: dict[str, Any]) -> bool:
    """The promise: exactly ``trials`` trials, numbers 0..trials-1 once each, all finished,
    Optuna's study the same size with nothing left running, and no completed result lost."""
    n, after = entry["trials"], entry["after"]
    from tuner.lifecycle.states import TrialState

    finished = set(TrialState.finished())
    return (
        after["sweep_state"] == "completed"
        and after["rows"] == after["distinct_numbers"] == n
        and (after["numbers_min"], after["numbers_max"]) == (0, n - 1)
        and set(after["states"]) <= finished
        and after["optuna_trials"] == n
        and set(after["optuna_states"]) <= {"COMPLETE", "PRUNED", "FAIL"}
        and after["disagree_with_optuna"] == 0
        and entry["completed_results_lost"] == 0
    )


class ResumeBenchmark(Benchmark):
    name = "resume"
    title = "Resume of a large sweep after SIGKILL"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        trials = ctx.size("resume_trials", QUICK_TRIALS, FULL_TRIALS)
        kill_at = ctx.size("resume_kill_at", trials // 2, trials // 2)
        names = ("sqlite", "postgresql")[: ctx.size("resume_databases", 2, 2)]
        result: dict[str, Any] = {"trials": trials, "kill_at": kill_at, "databases": {}}
        for db_name in names:
            ctx.log(f"resume: {trials} trials on {db_name}, SIGKILL at {kill_at} finished")
            with database_url(db_name, ctx.scratch / f"resume-{db_name}", "bench_resume") as url:
                entry = run_one(ctx.scratch / f"resume-{db_name}-home", url, trials, kill_at,
                                ctx.log)
            entry["exact"] = exact(entry)
            result["databases"][db_name] = entry
        return result

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        n = result["trials"]
        return [
            (f"{db}: a {n:,}-trial sweep SIGKILLed half-way and resumed counts exactly {n:,}",
             f"{e['after']['rows']:,} trials, numbers {e['after']['numbers_min']}–"
             f"{e['after']['numbers_max']:,} once each, Optuna {e['after']['optuna_trials']:,}; "
             f"{e['completed_results_lost']} results lost", bool(e["exact"]))
            for db, e in result["databases"].items()
        ]

    def render(self, result: dict[str, Any]) -> str:
        n = result["trials"]
        lines = [
            f"The scale benchmark's sweep ({n:,} trials, TPE with ASHA, parallelism 4, "
            "instant backend) run by a process of its own (`benchmarks/_sweep_process.py`). "
            f"Once {result['kill_at']:,} trials have finished, the process gets SIGKILL "
            "wherever it is; a new process then resumes the sweep as `tunehub sweep resume` "
            "does (a new engine claims it). Afterwards tunehub's trial rows and Optuna's "
            "study are counted and compared number by number.",
            "",
            "| database | killed after | at the kill: ours / Optuna's | resume took | "
            "after: trials, numbers | rerun | Optuna after | disagreements | results lost | "
            "exact |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for db, e in result["databases"].items():
            k, a = e["at_kill"], e["after"]
            lines.append(
                f"| {db} | {secs(e['killed_after_s'])} | {_counts(k['states'])} / "
                f"{_counts(k['optuna_states'])} | {secs(e['resumed_wall_s'])} | "
                f"{a['rows']:,}, {a['numbers_min']}–{a['numbers_max']:,} "
                f"({a['distinct_numbers']:,} distinct) | {a['rerun']} | "
                f"{_counts(a['optuna_states'])} | {a['disagree_with_optuna']} | "
                f"{e['completed_results_lost']} of {e['completed_before_kill']:,} | "
                f"{'yes' if e['exact'] else '**no**'} |"
            )
        lines += [
            "",
            "\"Rerun\": trials whose attempt was lost with the killed process and ran again "
            "under the same number. \"Results lost\": trials completed before the kill whose "
            "value changed or vanished after the resume.",
        ]
        return "\n".join(lines)


def _counts(states: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(states.items()))

"""Terminal output: tables, the live progress bar, JSON."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.lifecycle.states import TrialState, trials_done

# Piped, in CI or under nohup there is no terminal width to fit: print every value whole
# rather than squeezing columns to "0.0…" at rich's default of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 100_000)


def print_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def sweeps_table(sweeps: list[dict[str, Any]]) -> Table:
    table = Table(title="Sweeps")
    for col in ("id", "name", "owner", "state", "done", "best", "backend", "created"):
        table.add_column(col)
    for s in sweeps:
        done = trials_done(s)
        table.add_row(
            str(s["id"]), s["name"], s["owner"], s["state"], f"{done}/{s['trials']}",
            _fmt(s["best_value"]), s["backend"], (s["created_at"] or "")[:19],
        )
    return table


def leaderboard(sweep: dict[str, Any], trials: list[dict[str, Any]], top: int = 10) -> Table:
    maximize = sweep.get("direction") != "minimize"
    scored = [t for t in trials
              if t["value"] is not None and TrialState(t["state"]).is_scored()]
    scored.sort(key=lambda t: (t["state"] != TrialState.COMPLETED,
                               -t["value"] if maximize else t["value"]))
    params = list((sweep.get("spec") or {}).get("space", {}))
    gpus = any(t.get("gpu_use") for t in trials)
    table = Table(title=f"Leaderboard: sweep {sweep['id']} ({sweep['name']}), {sweep['metric']}")
    for col in ("trial", "state", sweep["metric"] or "value", *params, "steps", "seconds",
                *(("GPU use",) if gpus else ())):
        table.add_column(col)
    for t in scored[:top]:
        table.add_row(
            str(t["number"]), t["state"], _fmt(t["value"]),
            *(_fmt(t["params"].get(p)) for p in params),
            _fmt(t["last_step"]), _fmt(t["duration_seconds"]),
            *((gpu_use_cell(t.get("gpu_use")),) if gpus else ()),
        )
    return table


def gpu_use_cell(use: dict[str, Any] | None) -> str:
    """A trial's measured GPU use in a word or two: ``unused``, ``63% used`` (GPU-seconds used
    of those measured), or ``-`` when it held no GPU or none was measured."""
    if not use:
        return "-"
    if use.get("unused"):
        return "unused"
    measured = float(use.get("measured_seconds") or 0)
    if measured <= 0:
        return "-"
    return f"{float(use.get('used_seconds') or 0) / measured:.0%} used"


def gpu_unused_lines(trials: list[dict[str, Any]]) -> list[str]:
    """One line per trial whose latest attempt holds or held a GPU it does not use: a trial
    that asked for a GPU and runs on the CPU (what ``gpu_use.unused`` says in ``--json``)."""
    lines = []
    for t in trials:
        use = t.get("gpu_use") or {}
        if use.get("unused"):
            verb = "holds" if use.get("holding") else "held"
            lines.append(
                f"trial {t['number']} {verb} GPU {', '.join(use['unused_gpus'])} and did not "
                f"use it (attempt {use['attempt']}: no process on it, utilisation under the "
                "threshold); does its code run on the CPU?")
    return lines


def summary_line(sweep: dict[str, Any]) -> str:
    return (
        f"sweep {sweep['id']} {sweep['state']}: {sweep[TrialState.COMPLETED]} completed, "
        f"{sweep[TrialState.PRUNED]} pruned, {sweep[TrialState.FAILED]} failed; "
        f"best {sweep['metric']} = "
        f"{_fmt(sweep['best_value'])} (trial {_fmt(sweep['best_trial'])})"
        + (f"; {sweep['reason']}" if sweep.get("reason") else "")
    )


async def progress_until(
    task: asyncio.Task[Any], read: Callable[[], dict[str, Any]], quiet: bool = False
) -> None:
    """A live bar over finished trials while ``task`` runs (redrawn twice a second)."""
    if quiet:
        await task
        return
    first = read()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        bar_id = bar.add_task(f"sweep {first['id']}", total=first["trials"], status="")

        def show(s: dict[str, Any]) -> None:
            status = (
                f"best {_fmt(s['best_value'])}  ok {s[TrialState.COMPLETED]}"
                f"  pruned {s[TrialState.PRUNED]}  failed {s[TrialState.FAILED]}"
            )
            bar.update(bar_id, completed=trials_done(s),
                       status=status)

        while not task.done():
            show(read())
            await asyncio.wait([task], timeout=0.5)
        show(read())  # the final counts, as the summary below gives them
    await task

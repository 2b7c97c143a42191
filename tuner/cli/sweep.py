"""``tunehub sweep ...``: run, list, show, cancel, resume, logs."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

from tuner.backends import BACKENDS
from tuner.cli import context
from tuner.cli.errors import EXIT_FAILED, CliError, repeatable
from tuner.cli.ops import LocalOps, RemoteOps, ops
from tuner.cli.render import (
    console,
    gpu_unused_lines,
    leaderboard,
    print_json,
    progress_until,
    summary_line,
    sweeps_table,
)
from tuner.db.outage import once_reachable, waited
from tuner.lifecycle.states import SweepState, TrialState
from tuner.runtime import LocalRuntime
from tuner.spec import SweepSpec
from tuner.sweep_store import sweep_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweep", help="run and inspect hyperparameter sweeps")
    s = p.add_subparsers(dest="sweep_command", metavar="SUBCOMMAND", required=True)

    run = s.add_parser("run", help="submit a sweep spec (YAML) and run it")
    run.add_argument("spec", help="path to the sweep spec (YAML)")
    run.add_argument("--backend", choices=BACKENDS, default="local")
    run.add_argument("--wait", action="store_true", help="wait, with a progress bar")
    _json_flag(run)
    run.set_defaults(handler=cmd_run)

    ls = s.add_parser("list", help="your sweeps")
    _json_flag(ls)
    ls.set_defaults(handler=repeatable(cmd_list))

    show = s.add_parser("show", help="a sweep and its leaderboard")
    show.add_argument("id", type=_number("sweep id"))
    _json_flag(show)
    show.set_defaults(handler=repeatable(cmd_show))

    cancel = s.add_parser("cancel", help="stop a sweep and its running trials")
    cancel.add_argument("id", type=_number("sweep id"))
    _json_flag(cancel)
    cancel.set_defaults(handler=repeatable(cmd_cancel))

    resume = s.add_parser("resume", help="continue a sweep whose controller stopped")
    resume.add_argument("id", type=_number("sweep id"))
    resume.add_argument("--wait", action="store_true", help="wait, with a progress bar")
    resume.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    _json_flag(resume)
    resume.set_defaults(handler=cmd_resume)

    logs = s.add_parser(
        "logs", help="a trial's output (all attempts); without TRIAL the most useful one"
    )
    logs.add_argument("id", type=_number("sweep id"))
    logs.add_argument(
        "trial", type=_number("trial number"), nargs="?",
        help="trial number (default: the last failed trial, else the best)",
    )
    logs.set_defaults(handler=repeatable(cmd_logs))


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _number(what: str) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}")
        return int(text)

    return parse


def cmd_run(args: argparse.Namespace) -> int:
    spec = SweepSpec.from_yaml(args.spec)
    where = ops()
    # One name for this submission, the same on each try: sent again while the database is
    # away (or after a commit whose answer was lost), it finds the sweep it made.
    view = waited(where.submit, spec, args.backend, uuid.uuid4().hex)
    if args.wait:
        if isinstance(where, RemoteOps):
            return follow(where, view["id"], as_json=args.json)
        return drive(view["id"], args.backend, as_json=args.json)
    if isinstance(where, RemoteOps):
        return _submitted(view, args.json, "on the tuner service")
    pid = start_detached(view["id"])
    return _submitted({**view, "controller_pid": pid}, args.json, f"in the background (pid {pid})")


def _submitted(view: dict[str, Any], as_json: bool, where: str) -> int:
    if as_json:
        print_json(view)
    else:
        console.print(
            f"sweep {view['id']} ({view['name']}) submitted; running {where}.\n"
            f"  watch:  tunehub sweep show {view['id']}"
        )
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    where = ops()
    if isinstance(where, RemoteOps):
        view = where.resume(args.id)
        return follow(where, args.id, args.json) if args.wait else _submitted(
            view, args.json, "on the tuner service"
        )
    view = waited(where.get, args.id)  # nothing is done before this read: waiting is safe
    if args.wait:
        return drive(args.id, view["backend"], as_json=args.json, quiet=args.quiet)
    pid = start_detached(args.id)
    return _submitted({**view, "controller_pid": pid}, args.json, f"in the background (pid {pid})")


def start_detached(sweep_id: int) -> int:
    """A controller process of its own, so the sweep outlives this terminal."""
    log_path = sweep_dir(context.settings(), sweep_id) / "controller.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "sweep", "resume", str(sweep_id), "--wait",
             "--quiet"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ.copy(),
        )
    return proc.pid


def drive(sweep_id: int, backend: str, as_json: bool = False, quiet: bool = False) -> int:
    """Run the sweep's controller in this process until the sweep ends."""
    settings, db, local = context.settings(), context.database(), LocalOps()
    # The sweep outlives a database outage in this process: its controller and the
    # progress bar wait it out (tuner.db.outage), saying so once; the trials' reports to
    # this process's API get a 503 meanwhile, and their SDK sends them again.
    def read() -> dict[str, Any]:
        return waited(local.get, sweep_id)

    async def main() -> str:
        async with LocalRuntime(settings, db, [backend]) as engine:
            task = await once_reachable(engine.run_sweep, sweep_id)  # its claim waits an outage out
            await progress_until(task, read, quiet=quiet or as_json)
            return task.result()

    state = asyncio.run(main())
    waited(_final, local, sweep_id, as_json, quiet)
    return 0 if state == SweepState.COMPLETED else EXIT_FAILED


def follow(where: RemoteOps, sweep_id: int, as_json: bool) -> int:
    """Wait for a sweep the service runs, with the same progress bar."""

    async def main() -> None:
        async def until_finished() -> None:
            while not SweepState(where.get(sweep_id)["state"]).is_finished():
                await asyncio.sleep(1.0)  # refresh interval of the progress display

        task = asyncio.get_running_loop().create_task(until_finished())
        await progress_until(task, lambda: where.get(sweep_id), quiet=as_json)

    asyncio.run(main())
    state = _final(where, sweep_id, as_json, False)
    return 0 if state == SweepState.COMPLETED else EXIT_FAILED


def _final(where: LocalOps | RemoteOps, sweep_id: int, as_json: bool, quiet: bool) -> str:
    view = where.get(sweep_id)
    if as_json:
        print_json({**view, "trials_detail": where.trials(sweep_id)})
    elif not quiet:
        trials = where.trials(sweep_id)
        console.print(leaderboard(view, trials))
        console.print(summary_line(view), markup=False, highlight=False)
        if view.get("cold_start"):
            console.print(f"note: {view['cold_start']}", markup=False)
        for t in trials:  # unfinished trials that say why (e.g. waiting for the cluster)
            if not TrialState(t["state"]).is_finished() and t["reason"]:
                console.print(f"trial {t['number']} {t['state']}: {t['reason']}",
                              soft_wrap=True, markup=False, highlight=False)
        for line in gpu_unused_lines(trials):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
    return str(view["state"])


def cmd_list(args: argparse.Namespace) -> int:
    views = ops().list()
    if args.json:
        print_json(views)
    elif not views:
        console.print("no sweeps yet: tunehub sweep run SPEC")
    else:
        console.print(sweeps_table(views))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _final(ops(), args.id, args.json, False)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    view = ops().cancel(args.id)
    if args.json:
        print_json(view)
    elif view["state"] == SweepState.CANCELLING:
        console.print(f"sweep {view['id']}: cancelling (its controller stops the running trials)")
    else:
        console.print(f"sweep {view['id']}: {view['state']}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    where = ops()
    number = args.trial
    if number is None:
        number, why = most_useful_trial(where.get(args.id), where.trials(args.id))
        print(
            f"tunehub: trial {number} of sweep {args.id} ({why}); another trial: "
            f"tunehub sweep logs {args.id} TRIAL",
            file=sys.stderr,
        )
    sys.stdout.write(where.log(args.id, number))
    return 0


def most_useful_trial(sweep: dict[str, Any], trials: list[dict[str, Any]]) -> tuple[int, str]:
    """The trial whose log a user most likely wants: the last one that failed (its log says
    why), else the best, else the latest that started."""
    failed = [t for t in trials if t["state"] == TrialState.FAILED]
    if failed:
        t = max(failed, key=lambda t: t["number"])
        return t["number"], f"the last failed trial: {t['reason'] or TrialState.FAILED}"
    if sweep.get("best_trial") is not None:
        return int(sweep["best_trial"]), "the best trial"
    started = [t for t in trials if t["attempts"]]
    if not started:
        raise CliError(f"sweep {sweep['id']} has not started a trial yet")
    return max(t["number"] for t in started), "the latest trial"


__all__ = ["drive", "follow"]

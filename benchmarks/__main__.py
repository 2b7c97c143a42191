"""``python -m benchmarks [NAME ...] [--quick]``: run benchmarks, store raw numbers, render
``RESULTS.md``. Results of benchmarks not run this time are kept from earlier runs, so a subset
can be re-measured without losing the rest."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import all_benchmarks
from benchmarks._base import NotMeasured, RunContext
from benchmarks._common import git_commit, machine, versions, write_json
from benchmarks.report import render

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    names = [b.name for b in all_benchmarks()]
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="tunehub side by side with its peers; writes RESULTS.md and results.json.",
    )
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run (default: all): {', '.join(names)}")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, a smoke test; writes to benchmarks/quick/ unless --out")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for RESULTS.md and results.json (default: benchmarks/)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=N",
                   help="override a size, e.g. --set overhead_trials=200 (see --list)")
    p.add_argument("--profile", action="store_true",
                   help="also write cProfile dumps of tunehub's side to the output's profiles/")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--note", default=None,
                   help="a sentence for RESULTS.md about the conditions of this run (e.g. "
                        "that the machine was shared)")
    p.add_argument("--list", action="store_true", help="list benchmarks and their size keys")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: re-render RESULTS.md from the stored results.json")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in names]
    if unknown:
        p.error(f"unknown benchmark {unknown[0]!r}; expected one of {', '.join(names)}")
    options: dict[str, Any] = {}
    for item in args.sets:
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            p.error(f"--set expects KEY=N with N a number, got {item!r}")
        options[key.strip()] = int(value)
    args.options = options
    return args


SIZE_KEYS = {
    "overhead": "overhead_trials (1000), overhead_peer_trials (= trials), "
                "overhead_ray_default_trials (100)",
    "scale": "scale_trials (10000), scale_peer_trials (= trials), "
             "scale_databases (2: SQLite and PostgreSQL; 1: SQLite), "
             "scale_steps (3 reports per trial with ASHA; 0: final values only, no pruner)",
    "resume": "resume_trials (10000), resume_kill_at (= trials / 2), "
              "resume_databases (2: SQLite and PostgreSQL; 1: SQLite)",
    "tpe_view": "view_trials (2000), view_seeds (5)",
    "digits": "digits_trials (20 per sweep), digits_seeds (3), digits_epochs (12), "
              "digits_target_permille (970)",
    "search": "search_seeds (20), search_trials (40 per sweep), search_jobs (1: (workload, "
              "seed) pairs at a time), search_ray (1: also Ray Tune, with "
              "TUNEHUB_BENCH_RAY_PYTHON set)",
    "start_latency": "latency_trials (20 per mode)",
    "warm_imports": "warm_imports_trials (7 per row)",
    "kubernetes": "kube_trials (500)",
    "hub": "hub_users (50)",
    "pool": "pool_hours (9: simulated day at 64 GPUs), pool_scale_hours (3: at 1,000 GPUs)",
    "faults": "faults_outage_s (the database outage tests' own 15 s; 300: issue 29's "
              "5-minute outage)",
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    benches = all_benchmarks()
    if args.list:
        for b in benches:
            print(f"{b.name:15} {b.title}; sizes: {SIZE_KEYS.get(b.name, '-')}")
        return 0
    out = args.out or (HERE / "quick" if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    store_path = out / "results.json"
    store: dict[str, Any] = (
        json.loads(store_path.read_text()) if store_path.exists() else {"benchmarks": {}}
    )
    if args.note is not None:
        store["note"] = args.note
    if args.render_only:
        write_json(store_path, store)
        (out / "RESULTS.md").write_text(render(store, benches))
        print(f"wrote {out / 'RESULTS.md'}")
        return 0
    selected = [b for b in benches if not args.names or b.name in args.names]
    scratch = Path(tempfile.mkdtemp(prefix="tunehub-bench-"))
    command = "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    failures = 0
    try:
        for bench in selected:
            ctx = RunContext(
                quick=args.quick, scratch=scratch / bench.name,
                profile_dir=out / "profiles", options={**args.options, "profile": args.profile},
            )
            ctx.scratch.mkdir(parents=True, exist_ok=True)
            ctx.log(f"{bench.name}: {bench.title}")
            entry: dict[str, Any] = {
                "title": bench.title,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": command.strip(),
                "quick": args.quick,
                "options": args.options,
                "machine": machine(),
                "versions": versions(),
                "commit": git_commit(),
            }
            started = time.perf_counter()
            try:
                entry["result"] = bench.run(ctx)
            except NotMeasured as exc:
                entry["not_measured"] = str(exc)
                ctx.log(f"{bench.name}: not measured: {exc}")
            except Exception as exc:  # one broken benchmark must not hide the others
                failures += 1
                entry["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            entry["seconds"] = time.perf_counter() - started
            store["benchmarks"][bench.name] = entry
            write_json(store_path, store)  # after each benchmark: a crash keeps what ran
            (out / "RESULTS.md").write_text(render(store, benches))
            ctx.log(f"{bench.name}: done in {entry['seconds']:.0f} s")
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out / 'RESULTS.md'} and {store_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

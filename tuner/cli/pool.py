"""``tunehub pool`` and ``tunehub usage``: who holds each GPU and what it does, and the
GPU-hours allocated and used."""

from __future__ import annotations

import argparse
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

from rich.table import Table

from tuner.cli import context
from tuner.cli.errors import EXIT_FAILED, CliError, repeatable
from tuner.cli.render import console, print_json
from tuner.pool_view import parse_since, pool_view, usage_view


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pool = sub.add_parser("pool", help="the GPU pool: each GPU, who holds it, since when, "
                          "its utilisation and memory")
    pool.add_argument("--json", action="store_true", help="machine-readable output")
    pool.set_defaults(handler=repeatable(cmd_pool))

    usage = sub.add_parser("usage", help="GPU-hours allocated and used per person, group, "
                           "sweep, notebook")
    usage.add_argument("--since", required=True,
                       help="start of the period: a date (2026-11-01) or ISO date and time (UTC)")
    usage.add_argument("--json", action="store_true", help="machine-readable output")
    usage.set_defaults(handler=repeatable(cmd_usage))


def _remote() -> Any:
    if not os.environ.get("TUNEHUB_API_URL"):
        return None
    from tuner.sdk.client import TunerClient

    return TunerClient()


def _local(view: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    lock_dir = context.settings().gpu_locks_dir
    try:
        return view(lock_dir, *args)
    except OSError as exc:
        raise CliError(f"cannot read the pool's records in {lock_dir} ({exc.strerror or exc}); "
                       "only the platform reads them there: ask the tuner service instead (a "
                       "notebook terminal sets TUNEHUB_API_URL)", EXIT_FAILED) from None


def cmd_pool(args: argparse.Namespace) -> int:
    client = _remote()
    view = client.request("GET", "pool") if client else _local(pool_view)
    if args.json:
        print_json(view)
        return 0
    table = Table(title=f"GPU pool: {view['held']} of {view['total']} held ({view['gpu_source']})")
    for col in ("gpu", "state", "person", "holder", "since", "utilization", "memory"):
        table.add_column(col)
    absent: set[str] = set()
    for row in view["gpus"]:
        holder = row.get("holder") or {}
        table.add_row(str(row["gpu"]), row["state"], holder.get("person") or "-",
                      holder.get("what") or ("-" if row["state"] == "free" else "unknown"),
                      row.get("since_iso") or "-",
                      "-" if row.get("utilization") is None else f"{row['utilization']:.0%}",
                      memory_cell(row.get("memory_used_bytes"), row.get("memory_total_bytes")))
        if row.get("measure_absent"):
            absent.add(row["measure_absent"])
    console.print(table)
    if view.get("flavors"):  # Kubernetes: Kueue's flavors of the ClusterQueue
        console.print(flavors_table(view["flavors"]))
    if view.get("queue"):  # from the tuner service, which keeps the queue
        waiting = Table(title="Waiting for GPUs")
        for col in ("#", "person", "what", "gpus", "reason"):
            waiting.add_column(col)
        for q in view["queue"]:
            waiting.add_row(str(q["position"]), q["person"], q["what"], str(q["gpus"]),
                            q["reason"])
        console.print(waiting)
    if view.get("shares"):
        console.print(shares_table(view["shares"], view.get("groups") or []))
    if view.get("shares_error"):
        console.print(f"shares: {view['shares_error']}", markup=False, highlight=False)
    for error in view.get("errors") or ():  # Kubernetes: a part the tuner could not read
        console.print(f"not read: {error}", markup=False, highlight=False)
    for reason in sorted(absent):
        console.print(f"not measured: {reason}", markup=False, highlight=False)
    return 0


def flavors_table(flavors: list[dict[str, Any]]) -> Table:
    """Each Kueue flavor's GPUs: the ClusterQueue's nominal quota, in use, borrowed, free."""
    table = Table(title="Flavors (Kueue)")
    for col in ("flavor", "resource", "quota", "in use", "borrowed", "free"):
        table.add_column(col)
    for f in flavors:
        table.add_row(f["flavor"], f["resource"], f"{f['nominal']:g}", f"{f['used']:g}",
                      f"{f['borrowed']:g}", f"{f['free']:g}")
    return table


def shares_table(people: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Table:
    """Each person's (then each configured group's) weight, cap, GPUs held and waiting, and
    dominant share: why the queue is in its order (``TUNEHUB_POOL_SHARES``)."""
    table = Table(title="Shares")
    for col in ("person", "account / members", "weight", "cap", "held", "in queue", "share",
                "fair share"):
        table.add_column(col)
    for row in people:
        table.add_row(row["person"], row["account"], f"{row['weight']:g}",
                      "-" if row["max_gpus"] is None else str(row["max_gpus"]),
                      str(row["held_gpus"]), str(row["waiting_gpus"]), f"{row['share']:.2f}",
                      f"{row['fair_share_gpus']:g} GPUs")
    for group in groups:
        members = group.get("members")
        table.add_row(f"group {group['group']}",
                      "-" if members is None else "members: " + (", ".join(members) or "none"),
                      f"{group['weight']:g}",
                      "-" if group["max_gpus"] is None else str(group["max_gpus"]),
                      str(group["held_gpus"]), "-", "-", "-")
    return table


def memory_cell(used: int | None, total: int | None) -> str:
    if used is None or not total:
        return "-"
    return f"{used / 2**30:.1f} of {total / 2**30:.1f} GiB"


def cmd_usage(args: argparse.Namespace) -> int:
    since = parse_since(args.since)
    client = _remote()
    if client:
        view = client.request("GET", "usage?since=" + urllib.parse.quote(args.since))
    else:
        view = _local(usage_view, since)
    if args.json:
        print_json(view)
        return 0
    console.print(f"GPU-hours from {view['since_iso']} to {view['until_iso']}: "
                  f"{view['gpu_hours']:.2f} allocated, {view['used_gpu_hours']:.2f} used")
    for key in ("person", "group", "sweep", "notebook"):
        if not view[key]:
            continue
        table = Table(title=f"by {key}")
        table.add_column(key)
        table.add_column("GPU-hours allocated", justify="right")
        table.add_column("GPU-hours used", justify="right")
        used = view["used"][key]
        for name, hours in sorted(view[key].items(), key=lambda kv: -kv[1]):
            table.add_row(name, f"{hours:.2f}", f"{used.get(name, 0.0):.2f}")
        console.print(table)
    return 0

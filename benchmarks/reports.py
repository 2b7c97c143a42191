"""Report throughput of one tuner process (issue 30): simulated trials post their per-epoch
reports over real HTTP, with real trial tokens, to the real report route and database.

The tuner runs in a process of its own (``benchmarks/_report_server.py``: an engine on an
in-process backend whose attempts all hold, i.e. run without a process, and the report API on
loopback); this process is the load generator: one asyncio task per simulated trial, each on a
persistent HTTP/1.1 keep-alive connection (a minimal client on asyncio streams), sending its
reports in sequence (step 1..R, each waiting for the answer, as ``tuner.report`` does: URL
``/api/v1/trials/<id>/report``, body ``{value, step, attempt[, last]}``, ``Authorization:
Bearer <token>``). After the load the tuner ends every attempt, the sweeps complete, and what
the database holds is read back and compared with what was sent: every report, in tunehub's
``TrialReport`` table and in Optuna's study, must be there with the value sent for its step.

Scenarios: (a) the issue's baseline, 1 sweep × 8 trials × 400 reports; (b) 1 sweep × 500
trials; (c) 50 sweeps × 10 trials; (d) as (b), a sweep that never prunes, whose trials hold
their values and send them together as the SDK does; on PostgreSQL (a fresh cluster of its
own, ``initdb`` in the scratch directory, fsync on) and SQLite (a file in scratch). Peer in
the same run: plain Optuna's ``trial.report()`` + ``trial.should_prune()`` on the same kind
of database (``benchmarks/peers/optuna_report.py``).

Sizes (``--set``): ``reports_scenarios`` (15: a=1, b=2, c=4, d=8, summed), ``reports_databases``
(3: SQLite=1, PostgreSQL=2, summed), ``reports_baseline_steps`` (400; quick 40),
``reports_trials`` (b's trials: 500; quick 20), ``reports_sweeps`` / ``reports_sweep_trials``
(c: 50 × 10; quick 5 × 4), ``reports_steps`` (R of b and c: 40; quick 10),
``reports_peer_threads`` (8), ``reports_peer_budget_s`` (180; quick 60: plain Optuna's
time budget per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import resource
import select
import shutil
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._base import Benchmark, NotMeasured, RunContext
from benchmarks._common import REPO, free_port, ms, percentile, run_peer, secs, tunehub_env

PRUNER = "median"
TARGET_RATE, TARGET_P95 = 1000.0, 0.050
SCENARIOS = {
    "a": "the issue's baseline",
    "b": "one sweep, all its trials at once",
    "c": "many sweeps at once",
    "d": "one sweep, all its trials at once, values held and sent together as the SDK does",
}
#: The scenario whose trials hold their values (a sweep that never prunes, which the tuner lets
#: hold them for ``TUNEHUB_REPORT_BATCH_SECONDS``).
HOLDING = "d"
DB_LABEL = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def value_at(step: int) -> float:
    """Every simulated trial reports this curve: rising, so identical in every trial, which
    the median pruner never prunes (a trial is pruned only when strictly worse than the
    median), and a different value at every step, so a value stored at the wrong step shows."""
    return 1.0 - 1.0 / (step + 1)


# --- a PostgreSQL of the benchmark's own ---------------------------------------------------


def pg_bin() -> Path | None:
    """The PostgreSQL server binaries: ``TUNEHUB_BENCH_PG_BIN``, else the newest
    ``/usr/lib/postgresql/*/bin``, else ``initdb`` on the PATH."""
    explicit = os.environ.get("TUNEHUB_BENCH_PG_BIN")
    if explicit:
        return Path(explicit) if (Path(explicit) / "initdb").exists() else None
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class LocalPostgres:
    """``initdb`` + ``pg_ctl`` in a directory of the benchmark's scratch, on a free port, as the
    ``postgres`` user when run as root (the server refuses root). Server settings are the
    defaults (fsync, synchronous_commit and full_page_writes on, as a real server has them)
    except ``max_connections`` (200: room for 50 sweeps' pools) and loopback only."""

    root: Path
    bin: Path
    port: int = 0

    def _run(self, *args: str) -> None:
        argv = list(args)
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {proc.stderr.strip()[-800:]}")

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # The server user must reach its directory: o+x on the scratch directories above
            # (mkdtemp makes them 0700), and the directory its own.
            for parent in self.root.parents:
                with contextlib.suppress(OSError):
                    st = parent.stat()
                    if st.st_uid == 0 and not st.st_mode & stat.S_IXOTH:
                        parent.chmod(st.st_mode | stat.S_IXOTH)
            shutil.chown(self.root, "postgres", "postgres")
        # --no-sync: initdb's own final flush of the new cluster only; the server's fsync
        # stays on.
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U",
                  "postgres", "--no-sync")
        self.port = free_port()
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                  "-w", "-t", "60", "start", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                  "-c max_connections=200")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "stop", "-m",
                      "fast")

    def create_database(self, name: str) -> str:
        from sqlalchemy import create_engine, text

        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return self.url(name)

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the server: the postmaster and its live backends, plus what its
        exited children used; None where /proc cannot tell."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
                if int(entry.name) == pid:
                    total += utime + stime + int(fields[13]) + int(fields[14])
                elif ppid == pid:
                    total += utime + stime
        return total / tick


# --- the load generator --------------------------------------------------------------------


@dataclass
class TrialLoad:
    trial_id: int
    attempt: int
    token: str
    latencies: list[float]
    sent: dict[int, float]  # step -> value, for every report answered 200
    first: float = 0.0
    last: float = 0.0
    pruned: int = 0
    values: int = 0  # values the requests carried (several in a batch)


async def _trial(port: int, load: TrialLoad, steps: int, go: asyncio.Event,
                 errors: Counter[str], connected: list[asyncio.Future[None]],
                 interval: float = 0.0, offset: float = 0.0, holds: bool = False) -> None:
    """One simulated trial: its reports in sequence, each after the answer to the last; with
    ``interval``, at most one every ``interval`` seconds (a trial's epochs take time),
    starting ``offset`` seconds after the go so that trials do not all report at once. With
    ``holds``, its values are held and sent together as the SDK does where the tuner's answer
    grants ``batch_seconds`` (the first value alone; then what is held once the oldest is that
    old; the last step alone, after what is held)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        connected.pop().set_result(None)
    head = (f"POST /api/v1/trials/{load.trial_id}/report HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {load.token}\r\n").encode()
    window = 0.0
    held: list[dict[str, Any]] = []
    one_at_a_time = asyncio.Lock()  # one request at a time on the connection, in order
    timers: list[asyncio.Task[None]] = []

    async def post(body: dict[str, Any]) -> None:
        nonlocal reader, writer, window
        async with one_at_a_time:
            data = json.dumps(body).encode()
            t0 = time.perf_counter()
            if not load.first:
                load.first = t0
            try:
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(data) + data)
                status, answer, close = await _response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                errors[f"connection: {type(exc).__name__}"] += 1
                close, status = True, 0
            t1 = time.perf_counter()
            load.latencies.append(t1 - t0)
            load.last = t1
            values = body.get("steps") or [body]
            if status == 200:
                for item in values:
                    load.sent[item["step"]] = item["value"]
                reply = json.loads(answer)
                window = float(reply.get("batch_seconds") or 0) if holds else 0.0
                if reply.get("prune"):
                    load.pruned += 1  # counted; the curve goes on (the check wants all steps)
            elif status:
                errors[str(status)] += 1
            load.values += len(values)
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send_held() -> None:
        if held:
            batch = list(held)
            held.clear()
            await post({"steps": batch, "attempt": load.attempt})

    async def timer(seconds: float) -> None:
        await asyncio.sleep(seconds)  # the SDK's timer: held values go when the oldest is due
        await send_held()

    await go.wait()
    if offset:
        await asyncio.sleep(offset)  # pacing of the simulated load, not synchronisation
    try:
        for step in range(1, steps + 1):
            made = time.perf_counter()
            value = value_at(step)
            if window > 0 and step < steps:
                # Held: the training loop goes on at once; a timer sends what is held.
                if not held:
                    timers.append(asyncio.ensure_future(timer(window)))
                held.append({"step": step, "value": value})
            else:
                await send_held()
                body: dict[str, Any] = {"step": step, "attempt": load.attempt, "value": value}
                if step == steps:
                    body["last"] = True  # as the Keras callback's last epoch says
                await post(body)
            if interval and step < steps:
                # The next epoch's report, ``interval`` after this one was made.
                await asyncio.sleep(max(0.0, made + interval - time.perf_counter()))
        await send_held()
        await asyncio.gather(*timers)
    finally:
        for t in timers:
            t.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    status_line = await reader.readline()
    if not status_line:
        raise asyncio.IncompleteReadError(b"", None)
    status = int(status_line.split()[1])
    length, close = 0, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            length = int(value)
        elif key == b"connection" and value.strip().lower() == b"close":
            close = True
    answer = await reader.readexactly(length) if length else b""
    return status, answer, close


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def generate(port: int, attempts: list[list[Any]], steps: int,
                   offered: float = 0.0, holds: bool = False) -> dict[str, Any]:
    """All simulated trials at once; returns the raw figures and what was sent. ``offered``:
    reports per second the trials send together (each one every ``len(attempts) / offered``
    seconds, their starts spread over that interval); 0: each as fast as it is answered.
    ``holds``: values held and sent together where the tuner allows it (:func:`_trial`)."""
    interval = len(attempts) / offered if offered else 0.0
    go = asyncio.Event()
    errors: Counter[str] = Counter()
    loads = [TrialLoad(int(tid), int(att), tok, [], {}) for tid, att, tok in attempts]
    loop = asyncio.get_running_loop()
    connected: list[asyncio.Future[None]] = [loop.create_future() for _ in loads]
    waiting = list(connected)
    tasks = [asyncio.ensure_future(_trial(port, ld, steps, go, errors, connected, interval,
                                          interval * i / len(loads), holds))
             for i, ld in enumerate(loads)]
    await asyncio.gather(*waiting)  # every connection open before the clock starts
    cpu0 = _cpu()
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    cpu = _cpu() - cpu0
    for r in results:
        if isinstance(r, BaseException):
            errors[f"task: {type(r).__name__}: {r}"[:120]] += 1
    every = [x for ld in loads for x in ld.latencies]
    firsts = [ld.first for ld in loads if ld.first]
    wall = max(ld.last for ld in loads) - min(firsts) if firsts else float("nan")
    values = sum(ld.values for ld in loads)
    return {
        "reports": values,
        "requests": len(every),
        "wall_s": wall,
        "reports_per_s": values / wall if wall and wall == wall else None,
        "offered_per_s": offered or None,
        "latency_s": _lat(every),
        "errors": dict(errors),
        "pruned_answers": sum(ld.pruned for ld in loads),
        "generator_cpu_s": cpu,
        "_sent": {str(ld.trial_id): ld.sent for ld in loads},
    }


def _lat(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values)}


def check(sent: dict[str, dict[int, float]], stored: dict[str, dict[str, Any]],
          steps: int) -> dict[str, int]:
    """What the database holds against what each trial sent: a step missing (lost), a
    different value at a step (wrong: mixed up or reordered), a step never sent (extra), and
    a trial row whose ``last_step`` is not the last step sent (reordered)."""
    out = Counter({"lost": 0, "wrong": 0, "extra": 0, "optuna_lost": 0, "optuna_wrong": 0,
                   "optuna_extra": 0, "last_step_wrong": 0, "trials_missing": 0})
    for tid, mine in sent.items():
        row = stored.get(tid)
        if row is None:
            out["trials_missing"] += 1
            out["lost"] += len(mine)
            continue
        for kind, prefix in (("reports", ""), ("optuna", "optuna_")):
            have = {int(s): v for s, v in row[kind]}
            for step, value in mine.items():
                if step not in have:
                    out[prefix + "lost"] += 1
                elif have[step] != value:
                    out[prefix + "wrong"] += 1
            out[prefix + "extra"] += len(set(have) - set(mine))
        if mine and row.get("last_step") != max(mine):
            out["last_step_wrong"] += 1
    return dict(out)


# --- one scenario on one database ----------------------------------------------------------


def _read_json_line(proc: subprocess.Popen[str], timeout: float, err: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"the tuner process said nothing in {timeout:.0f} s:\n"
                               + _tail(err))
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 5.0))
        if not ready:
            if proc.poll() is not None:
                raise RuntimeError(f"the tuner process exited with {proc.returncode}:\n"
                                   + _tail(err))
            continue
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            raise RuntimeError(f"the tuner process exited with {proc.returncode}:\n"
                               + _tail(err))
        if line.startswith("{"):
            return dict(json.loads(line))


def _tail(path: Path, lines: int = 25) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


def run_tunehub(ctx: RunContext, key: str, url: str, home: Path, sweeps: int, trials: int,
                steps: int, pg: LocalPostgres | None, offered: float = 0.0,
                holds: bool = False) -> dict[str, Any]:
    err = ctx.scratch / f"{key}-server.log"
    argv = [sys.executable, "-m", "benchmarks._report_server", "--db-url", url, "--home",
            str(home), "--sweeps", str(sweeps), "--trials", str(trials), "--pruner",
            "none" if holds else PRUNER]
    if ctx.options.get("profile"):
        argv += ["--profile", str(ctx.profile_dir / f"reports-{key}.prof")]
    env = tunehub_env(home, url)
    started = time.perf_counter()
    with err.open("w") as err_file:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
        try:
            ready = _read_json_line(proc, 900, err)
            ctx.log(f"reports: {key}: {len(ready['attempts'])} attempts running after "
                    f"{ready['start_s']:.1f} s; load of {steps} reports each")
            pg0 = pg.cpu_seconds() if pg else None
            load = asyncio.run(generate(int(ready["port"]), ready["attempts"], steps, offered,
                                        holds))
            pg1 = pg.cpu_seconds() if pg else None
            assert proc.stdin is not None
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            final = _read_json_line(proc, 900, err)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    sent = load.pop("_sent")
    load["check"] = check(sent, final["trials"], steps)
    load["trials"] = len(sent)
    load["sweep_states"] = dict(Counter(final["sweep_states"].values()))
    load["tuner_cpu_s"] = final["served_cpu_s"]
    load["tuner_served_s"] = final["served_wall_s"]
    load["start_s"] = ready["start_s"]
    if pg0 is not None and pg1 is not None:
        load["postgres_cpu_s"] = pg1 - pg0
    load["process_wall_s"] = time.perf_counter() - started
    return load


def run_optuna(ctx: RunContext, url: str, sweeps: int, trials: int, steps: int,
               db_name: str, pruner: str = PRUNER) -> dict[str, Any]:
    threads = ctx.size("reports_peer_threads", 8, 8)
    budget = ctx.size("reports_peer_budget_s", 60, 180)
    res = run_peer("optuna_report",
                   ["--storage", url, "--studies", str(sweeps), "--trials", str(trials),
                    "--steps", str(steps), "--threads", str(threads), "--pruner", pruner,
                    "--budget-s", str(budget)],
                   env=tunehub_env(ctx.scratch, url), timeout=3600)
    res["command"] = res["command"].replace(url, f"<{db_name} url>")
    return res


@contextlib.contextmanager
def databases(ctx: RunContext, db_name: str, key: str,
              pg: LocalPostgres | None) -> Iterator[tuple[str, str]]:
    """Fresh databases for tunehub and for the peer (SQLite: two files; PostgreSQL: two
    databases in the cluster)."""
    if db_name == "sqlite":
        d = ctx.scratch / key
        d.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{d / 'tunehub.sqlite'}", f"sqlite:///{d / 'optuna.sqlite'}"
        return
    assert pg is not None
    yield pg.create_database(f"tunehub_{key}"), pg.create_database(f"optuna_{key}")


class ReportsBenchmark(Benchmark):
    name = "reports"
    title = "Report throughput of one tuner"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        which = ctx.size("reports_scenarios", 15, 15)
        dbs = ctx.size("reports_databases", 3, 3)
        sizes = {
            "a": (1, 8, ctx.size("reports_baseline_steps", 40, 400)),
            "b": (1, ctx.size("reports_trials", 20, 500), ctx.size("reports_steps", 10, 40)),
            "c": (ctx.size("reports_sweeps", 5, 50), ctx.size("reports_sweep_trials", 4, 10),
                  ctx.size("reports_steps", 10, 40)),
        }
        sizes[HOLDING] = sizes["b"]
        chosen = [k for bit, k in ((1, "a"), (2, "b"), (4, "c"), (8, HOLDING)) if which & bit]
        # (b) and (c): the trials together offer this many reports a second (each trial one
        # every trials/offered seconds, as epochs take time); 0: as fast as answered, as (a).
        offered = float(ctx.size("reports_offered_per_s", 1000, 1000))
        names = [n for bit, n in ((1, "sqlite"), (2, "postgresql")) if dbs & bit]
        result: dict[str, Any] = {
            "pruner": PRUNER, "peer_threads": ctx.size("reports_peer_threads", 8, 8),
            "offered_per_s": offered,
            "peer_budget_s": ctx.size("reports_peer_budget_s", 60, 180),
            "scenarios": {k: {"sweeps": s, "trials": t, "steps": r, "databases": {}}
                          for k, (s, t, r) in sizes.items() if k in chosen},
            "not_measured": {},
        }
        pg: LocalPostgres | None = None
        if "postgresql" in names:
            binary = pg_bin()
            if binary is None:
                names.remove("postgresql")
                result["not_measured"]["postgresql"] = (
                    "no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
                if not names:
                    raise NotMeasured(result["not_measured"]["postgresql"])
            else:
                pg = LocalPostgres(ctx.scratch / "pg", binary)
                ctx.log(f"reports: starting PostgreSQL of our own ({binary})")
                pg.start()
                result["postgres_bin"] = str(binary)
        try:
            for key in chosen:
                sweeps, trials, steps = sizes[key]
                for db_name in names:
                    tag = f"{key}_{db_name}"
                    shape = _shape({"sweeps": sweeps, "trials": trials, "steps": steps})
                    ctx.log(f"reports: ({key}) {shape} on {db_name}: tunehub")
                    entry: dict[str, Any] = {}
                    with databases(ctx, db_name, tag,
                                   pg if db_name == "postgresql" else None) as (th_url, op_url):
                        entry["tunehub"] = run_tunehub(
                            ctx, tag, th_url, ctx.scratch / f"{tag}-home", sweeps, trials,
                            steps, pg if db_name == "postgresql" else None,
                            0.0 if key == "a" else offered, holds=key == HOLDING)
                        th = entry["tunehub"]
                        ctx.log(f"reports: ({key}) {db_name}: {_rate(th)} reports/s, p95 "
                                f"{ms(th['latency_s'].get('p95'))}, errors {th['errors']}, "
                                f"check {th['check']}")
                        ctx.log(f"reports: ({key}) {db_name}: plain Optuna")
                        entry["optuna"] = run_optuna(ctx, op_url, sweeps, trials, steps,
                                                     db_name,
                                                     "none" if key == HOLDING else PRUNER)
                        ctx.log(f"reports: ({key}) {db_name}: plain Optuna "
                                f"{_rate(entry['optuna'])} reports/s")
                    result["scenarios"][key]["databases"][db_name] = entry
        finally:
            if pg is not None:
                pg.stop()
        return result

    def headline(self, result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
        rows: list[tuple[str, str, bool | None]] = []
        for key, sc in result["scenarios"].items():
            for db_name, entry in _in_order(sc["databases"]):
                th = entry.get("tunehub")
                if not th:
                    continue
                what = f"({key}) {_shape(sc)}, {DB_LABEL[db_name]}"
                rate, p95 = th.get("reports_per_s"), th["latency_s"].get("p95")
                bad = _bad(th)
                measured = (f"{_rate(th)} reports/s, p95 {ms(p95)}, {bad} lost or wrong, "
                            f"{sum(th['errors'].values())} errors")
                if key == "a" or db_name != "postgresql":
                    rows.append((f"{what}: 0 lost or reordered", measured, bad == 0))
                    continue
                if key == HOLDING:
                    met = (rate is not None and rate >= TARGET_RATE and bad == 0
                           and not th["errors"])
                    rows.append((f"{what}, values held by the SDK: ≥ 1,000 reports/s, 0 lost "
                                 "(the trial waits on no report: p95 is per request, "
                                 f"{th.get('requests', 0):,} requests)", measured, met))
                    continue
                met = (rate is not None and rate >= TARGET_RATE and p95 is not None
                       and p95 < TARGET_P95 and bad == 0 and not th["errors"])
                rows.append((f"{what}: ≥ 1,000 reports/s, p95 < 50 ms, 0 lost", measured, met))
        return rows

    def render(self, result: dict[str, Any]) -> str:
        lines = [
            "One tuner process (`benchmarks/_report_server.py`: the engine, "
            "`tuner.api.make_app` on tornado's `HTTPServer` on loopback) takes reports from "
            "simulated trials: an in-process backend holds every attempt running (no trial "
            "process), and a load generator in another process (one asyncio task per trial, a "
            "persistent HTTP/1.1 keep-alive connection each, a minimal client on asyncio "
            "streams) posts each trial's reports in sequence with the attempt's real token, "
            "exactly what `tuner.report(value, step=...)` sends, waiting for each answer "
            "before the next. reports/s = reports answered / wall time from the first send to "
            "the last answer; latency is per report as the trial sees it. Afterwards every "
            "attempt ends, the sweeps complete, and what the database holds is compared with "
            "what was sent, in tunehub's `TrialReport` table and in Optuna's study "
            "(`optuna.load_study(...).trials`): *lost* = a step missing, *wrong* = a different "
            "value at a step (mixed up or reordered; every step has its own value) or a "
            "trial's `last_step` not its last.",
            "",
            f"Sampler random, one float parameter, pruner **{result['pruner']}** (tunehub's "
            "`make_pruner`: Optuna's `MedianPruner` behind tunehub's min-trials rule). Every "
            "trial reports the same rising curve, 1 − 1/(step+1), which the median pruner "
            "never prunes (only a value strictly worse than the median is).",
            "",
            "Databases: PostgreSQL is a fresh cluster of the benchmark's own (`initdb` in the "
            "scratch directory, defaults: **fsync and synchronous_commit on**, as a real "
            "server has them; `max_connections=200`), on the same machine; SQLite a file in "
            "scratch, opened as tunehub opens it (WAL, `synchronous=NORMAL`).",
            "",
            "Peer in the same run: plain Optuna on the same kind of database (another database "
            "in the same cluster; another SQLite file) with the same pruner, the same trials "
            "and steps: `trial.report(value, step)` then `trial.should_prune()` per report, "
            f"from {result['peer_threads']} threads in one process (each thread takes its "
            "share of the trials round-robin and reports them step by step, so all trials "
            "advance together), storage opened by `tuner.search.study.storage_for`. Its "
            "latency is that pair of calls. Plain Optuna's cost per report grows with the "
            "study (its RDB storage reads the trial back on `should_prune()`, and the pruner "
            "reads the study), so it runs under a time budget"
            + (f" ({result['peer_budget_s']} s)" if result.get("peer_budget_s") else "")
            + ": each thread stops at the first step after it, and its figures are of the "
            "steps it did (said in the row where it stopped early).",
            "",
            "CPU columns: the seconds each process used during the load (generator: this "
            "process; tuner: the server process, ready to stop; PostgreSQL: postmaster and "
            "backends) — on a small machine they share the same cores, so a generator that "
            "takes much CPU lowers what the tuner can do.",
        ]
        for db_name, why in result.get("not_measured", {}).items():
            lines += ["", f"**{DB_LABEL[db_name]} not measured:** {why}."]
        for key, sc in result["scenarios"].items():
            if not sc["databases"]:
                continue
            lines += [
                "",
                f"**({key}) {SCENARIOS[key]}:** {_shape(sc)} = "
                f"{sc['sweeps'] * sc['trials'] * sc['steps']:,} reports"
                + (f", offered at {result['offered_per_s']:,.0f} reports/s (each trial one "
                   f"report every {sc['sweeps'] * sc['trials'] / result['offered_per_s']:.2f} s, "
                   "the next only after the answer to the last; their starts spread over that "
                   "interval), so latency is what a trial waits at that load and reports/s "
                   "falls below the offered rate only where the tuner cannot keep up; plain "
                   "Optuna as fast as it goes."
                   if key != "a" and result.get("offered_per_s") else
                   ", each trial reporting as fast as it is answered.")
                + (" Its sweep has `pruner: none`, so the tuner's answers grant "
                   "`batch_seconds` (`TUNEHUB_REPORT_BATCH_SECONDS`, 1 s): each trial sends its "
                   "first value alone, then what it holds once the oldest is that old (the "
                   "SDK's timer), and its last step alone after what it holds; reports/s counts "
                   "values, the latency columns are per request (the trial waits on none of "
                   "them). Plain Optuna with no pruner." if key == HOLDING else ""),
                "",
                "| database | tool | reports/s | p50 | p95 | p99 | errors | lost / wrong "
                "(tunehub rows; Optuna) | CPU: generator / tuner / PostgreSQL |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for db_name, entry in _in_order(sc["databases"]):
                th, op = entry.get("tunehub"), entry.get("optuna")
                label = DB_LABEL[db_name]
                if th:
                    c, lat = th["check"], th["latency_s"]
                    errs = ", ".join(f"{n}× {k}" for k, n in th["errors"].items()) or "0"
                    lines.append(
                        f"| {label} | tunehub (HTTP) | **{_rate(th)}** | {ms(lat.get('p50'))} "
                        f"| {ms(lat.get('p95'))} | {ms(lat.get('p99'))} | {errs} | "
                        f"{c['lost']} / {c['wrong'] + c['last_step_wrong'] + c['extra']}; "
                        f"{c['optuna_lost']} / {c['optuna_wrong'] + c['optuna_extra']} | "
                        f"{secs(th['generator_cpu_s'])} / {secs(th['tuner_cpu_s'])} / "
                        f"{secs(th.get('postgres_cpu_s'))} |")
                if op:
                    lat = op["latency_s"]
                    done = op.get("steps_done", sc["steps"])
                    part = (f" (stopped at its {op.get('budget_s', 0):.0f} s budget: "
                            f"{op['reports']:,} reports, steps 1–{done})"
                            if done < sc["steps"] else "")
                    lines.append(
                        f"| {label} | plain Optuna, {op['threads']} threads{part} | "
                        f"{_rate(op)} | "
                        f"{ms(lat.get('p50'))} | {ms(lat.get('p95'))} | {ms(lat.get('p99'))} "
                        f"| – | {op['lost']} / {op['wrong']} | – / {secs(op['cpu_s'])} / – |")
        lines += [
            "",
            "Targets (issue 30): on PostgreSQL, one tuner process takes ≥ 1,000 reports/s "
            "from 500 concurrent trials of one sweep (b) and from 50 sweeps at once (c), "
            "with report latency p95 < 50 ms; nothing reported lost or reordered (0 in the "
            "lost / wrong column) anywhere. (a) is the issue's baseline.",
        ]
        return "\n".join(lines)


def _in_order(entries: dict[str, Any]) -> list[tuple[str, Any]]:
    """SQLite first, then PostgreSQL (the stored JSON has its keys sorted)."""
    return sorted(entries.items(), key=lambda kv: list(DB_LABEL).index(kv[0]))


def _shape(sc: dict[str, Any]) -> str:
    sweeps = "1 sweep" if sc["sweeps"] == 1 else f"{sc['sweeps']} sweeps"
    return f"{sweeps} × {sc['trials']} trials × {sc['steps']} reports"


def _bad(th: dict[str, Any]) -> int:
    c = th["check"]
    return int(sum(v for k, v in c.items()))


def _rate(d: dict[str, Any]) -> str:
    rate = d.get("reports_per_s")
    return "n/a" if rate is None else f"{rate:,.0f}"

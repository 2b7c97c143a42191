"""The database goes away in the middle of a sweep and comes back: nothing is lost.

A PostgreSQL of the test's own (``initdb`` and ``pg_ctl`` in a temporary directory, on a free
port; never the machine's shared one) is crashed with ``pg_ctl stop -m immediate`` while a
sweep has trials completed and trials running, kept down for 15 s (issue 29's figure), and
started again: once for a sweep run from the CLI (``--wait``), once for a sweep the tuner
service runs, submitted and watched from the notebook client. The CLI and the service say so
once in plain words, never a traceback; the notebook's ``watch()`` returns as without an
outage; the sweep ends with exactly its trials, each number once, every report landed, and
Optuna's study equal to ours. The CLI's writing commands (``sweep cancel``, ``model
promote``, ``sweep run``, ``sweep resume``) wait an outage out too and act once.

The outage's length is ``TUNEHUB_FAULT_OUTAGE_S`` when set (``python -m benchmarks faults --set
faults_outage_s=300`` measures a 5-minute outage; too slow for the suite).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from sqlalchemy import func, select

from tests.conftest import Home
from tests.fault_records import FaultRecord, outage_seconds
from tests.fault_records import record as record_fault
from tests.polling import InBackground, wait_for
from tests.service_fixtures import running_tuner_hub
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL, parse_json, record_dir, write_sweep
from tunehub_base.outage import OUTAGE_SECONDS
from tunehub_base.ports import unclaimed_port
from tuner.db import Database, SweepRow, Trial, TrialReport
from tuner.sdk.client import Sweep, TunerClient
from tuner.serving.registry import Registry
from tuner.sweep_store import local_actor

READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
TRIALS, STEPS = 8, 4
#: How long the database stays down (the fault's length): issue 29's 15 s, or the
#: benchmark's size.
DOWN_SECONDS = outage_seconds(15.0)
MESSAGE = "database unreachable since"

# A trial that reports several steps; before each report it leaves a mark (the test sees
# reports being sent while the database is down).
TRAIN = f"""
import os, time, tuner
p = tuner.params()
n = os.environ["TUNEHUB_TRIAL_NUMBER"]
for step in range(1, {STEPS + 1}):
    time.sleep(0.4)  # the workload: an epoch
    with open(os.path.join(os.environ["RECORD_DIR"], f"{{n}}-{{step}}"), "w") as f:
        f.write(str(time.time()))
    tuner.report(p["x"] * 10 + step, step=step)
"""


@dataclass
class Postgres:
    """A PostgreSQL server of the test's own, run as the ``postgres`` user (it refuses root)."""

    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, timeout=120)

    def start(self) -> None:
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                 "-w", "-t", "60", "start", "-o",
                 f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                 "-c fsync=off")

    def crash(self) -> None:
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "stop", "-m", "immediate")


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    root = Path(tempfile.mkdtemp(prefix="tunehub-pg-"))
    shutil.chown(root, "postgres", "postgres")
    pg = Postgres(root, unclaimed_port())
    pg._pg(str(PG_BIN / "initdb"), "-D", str(pg.data), "-A", "trust", "-U", "postgres",
           "--no-sync")
    pg.start()
    yield pg
    subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D",
                    str(pg.data), "stop", "-m", "immediate"], capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


class Output:
    """A process's stream read as it comes (the test waits on what the CLI says)."""

    def __init__(self, stream: object) -> None:
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.text += line

    def done(self) -> str:
        self._thread.join(timeout=60)
        return self.text


def assert_nothing_lost(db: Database, url: str, sweep_id: int,
                        detail: list[dict[str, Any]]) -> None:
    """After the outage: every report landed once, and Optuna's study equals ours (the
    trials' numbers, values, states and steps); the test's engine is disposed of."""
    ours = {t["number"]: t["value"] for t in detail}
    with db.session() as s:
        row = s.get(SweepRow, sweep_id)
        assert row is not None
        study_name = row.study_name
        reports = s.execute(select(func.count()).select_from(TrialReport)).scalar_one()
    assert reports == TRIALS * STEPS  # every report landed, once per step
    study = optuna.load_study(study_name=study_name, storage=url)
    assert len(study.trials) == TRIALS
    assert {t.number: t.value for t in study.trials} == ours
    assert {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    for t in study.trials:
        assert sorted(t.intermediate_values) == list(range(1, STEPS + 1)), t
    db.dispose()


def test_postgres_crash_mid_sweep_loses_nothing(
    postgres: Postgres, tmp_path: Path
) -> None:
    home = Home(tmp_path / "home", postgres.url)
    record = record_dir(home, tmp_path)
    spec = write_sweep(tmp_path / "code", TRAIN, trials=TRIALS, parallelism=2, max_retries=0,
                       sampler="random")
    db = Database(postgres.url)

    def trials() -> list[Trial]:
        with db.session() as s:
            return list(s.scalars(select(Trial)))

    cli = home.popen("sweep", "run", str(spec), "--wait", "--json")
    stdout, stderr = Output(cli.stdout), Output(cli.stderr)
    lister: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: sum(t.state == "completed" for t in trials()) >= 2
                 and any(t.state == "running" for t in trials()),
                 timeout=300, what="two completed trials and one running")
        db.dispose()
        postgres.crash()
        crashed_at = time.time()
        # Down until the CLI has said so and the outage has lasted its length.
        wait_for(lambda: MESSAGE in stderr.text, timeout=120, what="the CLI's message")
        # A command that only reads, run meanwhile, waits the outage out too.
        lister = home.popen("sweep", "list", "--json")
        listed, list_err = Output(lister.stdout), Output(lister.stderr)
        wait_for(lambda: MESSAGE in list_err.text or lister.poll() is not None, timeout=120,
                 what="sweep list to say the database is away")
        wait_for(lambda: time.time() > crashed_at + DOWN_SECONDS, timeout=DOWN_SECONDS + 5,
                 what="the outage's length")
        assert cli.poll() is None, stderr.text[-3000:]
        assert lister.poll() is None, list_err.text[-3000:]
        postgres.start()
        restarted_at = time.time()
        wait_for(lambda: "database reachable again" in stderr.text or cli.poll() is not None,
                 timeout=300, what="the CLI to carry on")
        recovered_at = time.time()
        lister.wait(timeout=300)
        cli.wait(timeout=600)
    finally:
        for proc in (cli, lister):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert lister is not None and lister.returncode == 0, list_err.done()[-3000:]
    said = list_err.done()
    assert said.count(MESSAGE) == 1 and "Traceback" not in said, said[-3000:]
    assert [v["name"] for v in parse_json(listed.done())] == ["t"], listed.text
    err, out = stderr.done(), stdout.done()
    assert cli.returncode == 0, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    # Said once in plain words (and once that it is back), not once per request.
    assert err.count(MESSAGE) == 1, err[-4000:]
    assert "database reachable again" in err, err[-4000:]
    assert " 503 " not in err, err[-4000:]
    # Trials went on through the outage: they sent reports while the database was down
    # (answered 503 and sent again by the SDK).
    sent = [float(p.read_text()) for p in record.iterdir()]
    assert any(crashed_at < t < restarted_at for t in sent), (crashed_at, sorted(sent))
    result = parse_json(out)
    assert result["state"] == "completed", result
    detail = result["trials_detail"]
    assert sorted(t["number"] for t in detail) == list(range(TRIALS)), detail
    assert all(t["state"] == "completed" for t in detail), detail
    # Trials running through the outage kept running: none was started again.
    assert all(t["attempts"] == 1 for t in detail), detail

    assert_nothing_lost(db, postgres.url, result["id"], detail)
    record_fault(FaultRecord(
        fault="PostgreSQL crashed (`pg_ctl stop -m immediate`) mid-sweep, CLI `--wait`",
        duration_s=round(restarted_at - crashed_at, 1), sweeps=1, trials=TRIALS, running=2,
        lost=0, recover_s=round(recovered_at - restarted_at, 1),
        seen="the CLI said once \"database unreachable since …, retrying\" and that it was "
             "back; trials kept running (their reports retried), the sweep completed"))


GATED = """
import os, time, tuner
tuner.params()
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.2)
tuner.report(1.0)
"""


def test_cli_writes_wait_the_outage_out_and_act_once(postgres: Postgres, tmp_path: Path) -> None:
    """``sweep cancel``, ``model promote``, ``sweep run`` and ``sweep resume`` started while the
    database is down wait it out as the reading commands do (saying so once) and act when it is
    back, once: one sweep submitted, one resumed to its end; made again, a cancel or a
    promotion changes nothing (a cancelled sweep is answered as it is, a version keeps its one
    history entry for its stage)."""
    home = Home(tmp_path / "home", postgres.url)
    db = Database(postgres.url)

    def trial_running(sweep_id: int) -> bool:
        with db.session() as s:
            return any(t.state == "running" for t in s.scalars(
                select(Trial).where(Trial.sweep_id == sweep_id)))

    gate = tmp_path / "gate"
    ids = {}
    for name, opens in (("t", tmp_path / "never"), ("b", gate)):
        spec = write_sweep(tmp_path / name, GATED, name=name, trials=1, parallelism=1,
                           max_retries=0, env={"GATE": str(opens)})
        submitted = parse_json(home.cli("sweep", "run", str(spec), "--json", check=True).stdout)
        ids[name] = submitted["id"]
        controller = submitted["controller_pid"]
        wait_for(lambda: trial_running(ids[name]), timeout=120,  # noqa: B023
                 what=f"sweep {name}'s trial to run")
        # No controller: the cancel is made where it is asked, the resume takes it over.
        os.kill(controller, signal.SIGKILL)
    sweep_id = ids["t"]
    source = tmp_path / "model"
    source.mkdir()
    (source / "saved_model.pb").write_bytes(MINIMAL_SAVED_MODEL)
    registry = Registry(db, tmp_path / "registry")
    registry.register(model="m", source_dir=source, owner=local_actor().name, metric="x",
                      direction="maximize", metric_value=1.0, trusted=tmp_path)
    db.dispose()
    postgres.crash()
    cancel = home.popen("sweep", "cancel", str(sweep_id), "--json")
    promote = home.popen("model", "promote", "m", "1", "--stage", "production", "--json")
    quick = write_sweep(tmp_path / "quick", "import tuner\ntuner.report(1.0)\n", name="quick",
                        trials=1)
    submit = home.popen("sweep", "run", str(quick), "--wait", "--json")
    resume = home.popen("sweep", "resume", str(ids["b"]), "--wait", "--json")
    procs = {"cancel": cancel, "promote": promote, "submit": submit, "resume": resume}
    outputs = {name: (Output(proc.stdout), Output(proc.stderr)) for name, proc in procs.items()}
    try:
        for name, (_, err) in outputs.items():
            wait_for(lambda err=err: MESSAGE in err.text, timeout=120,  # type: ignore[misc]
                     what=f"{name} to say the database is away")
        assert all(proc.poll() is None for proc in procs.values())
        postgres.start()
        gate.touch()  # sweep b's trial may finish now
        for proc in procs.values():
            proc.wait(timeout=300)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, proc in procs.items():
        out, err = (o.done() for o in outputs[name])
        assert proc.returncode == 0, (name, err[-3000:])
        assert err.count(MESSAGE) == 1 and "Traceback" not in err, (name, err[-3000:])
    assert parse_json(outputs["cancel"][0].text)["state"] == "cancelled"
    assert parse_json(outputs["promote"][0].text)["stage"] == "production"
    assert parse_json(outputs["submit"][0].text)["state"] == "completed"
    assert parse_json(outputs["resume"][0].text)["state"] == "completed"
    listed = parse_json(home.cli("sweep", "list", "--json", check=True).stdout)
    assert sorted(v["name"] for v in listed) == ["b", "quick", "t"], listed  # submitted once
    # Made again, each changes nothing.
    again = home.cli("sweep", "cancel", str(sweep_id), "--json", check=True)
    assert parse_json(again.stdout)["state"] == "cancelled"
    home.cli("model", "promote", "m", "1", "--stage", "production", check=True)
    [version] = registry.versions("m")
    assert [h["stage"] for h in version.history] == ["production"], version.history
    with db.session() as s:
        cancelled = s.scalars(select(Trial).where(Trial.sweep_id == sweep_id))
        assert {t.state for t in cancelled} == {"cancelled"}
    db.dispose()


def test_service_answers_503_while_the_database_is_away(
    postgres: Postgres, tmp_path: Path
) -> None:
    """The tuner service behind a real hub: during the outage an API call is a 503 with
    ``Retry-After`` and a JSON error body (never a 500 or a traceback); afterwards the same
    call works again, with nothing restarted."""
    with running_tuner_hub(tmp_path, postgres.url) as hub:
        alice = hub.client(hub.token("alice", READ_SUBMIT))
        assert alice.get("sweeps").status_code == 200
        postgres.crash()
        down = alice.get("sweeps")
        assert down.status_code == 503, down.text
        assert int(down.headers["Retry-After"]) > 0
        body = down.json()
        assert body["status"] == 503 and "database unreachable" in body["error"], body
        assert "Traceback" not in down.text
        # The notebook client sends its call again while it gets 503s: it returns once the
        # database is back, with the answer.
        client = TunerClient(url=f"{hub.url}services/tuner", token=hub.token("alice", READ_SUBMIT))
        waiting = InBackground(lambda: client.request("GET", "sweeps"))
        refused = "GET /services/tuner/api/v1/sweeps -> 503"  # the service's log, per answer
        wait_for(lambda: waiting.answers or hub.log.read_text().count(refused) >= 3,
                 timeout=60, what="the client's call answered 503 twice")
        assert not waiting.answers, waiting.answers
        postgres.start()
        answers = waiting.join(timeout=120)
        assert answers == [[]], answers
        wait_for(lambda: alice.get("sweeps").status_code == 200, timeout=120,
                 what="the API to answer again")
        # The service's log (in the hub's, with its proxy's) says it once, and that it is over.
        wait_for(lambda: "database reachable again" in hub.log.read_text(), timeout=60,
                 what="the service to say the database is back")
        log = hub.log.read_text()
        assert log.count(MESSAGE) == 1, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def test_postgres_crash_mid_service_sweep_loses_nothing(
    postgres: Postgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep the tuner service runs (submitted with ``Sweep.submit`` from a notebook, not
    the CLI's ``--wait``): PostgreSQL crashes with trials completed and running, stays down
    ``DOWN_SECONDS`` and comes back. The notebook's ``watch()`` waits through it (its calls
    answered 503 are sent again, said once) and returns when the sweep ends; the service's
    controller carries on; every trial is accounted for and Optuna's study equals ours."""
    caplog.set_level("WARNING", logger="tunehub.client")
    db = Database(postgres.url)

    def trials() -> list[Trial]:
        with db.session() as s:
            return list(s.scalars(select(Trial)))

    with running_tuner_hub(tmp_path, postgres.url) as hub:
        record = hub.data / "record"
        record.mkdir(parents=True)
        record.chmod(0o777)  # the trials may run as the person's own Unix user
        path = write_sweep(hub.data / "code", TRAIN, name="outage", trials=TRIALS,
                           parallelism=2, max_retries=0, sampler="random",
                           env={"RECORD_DIR": str(record)})
        spec = yaml.safe_load(path.read_text())
        spec["code"] = str(path.parent)  # the data store, where the service takes code from
        client = TunerClient(url=f"{hub.url}services/tuner",
                             token=hub.token("alice", READ_SUBMIT))
        sweep = Sweep.submit(spec, client=client)
        # The notebook's cell: watch() until the sweep ends, through the outage.
        watched: list[object] = []

        def watch() -> None:
            try:
                watched.append(sweep.watch(interval=0.5))
            except BaseException as exc:  # (shown by the assertion below)
                watched.append(exc)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_for(lambda: sum(t.state == "completed" for t in trials()) >= 2
                 and any(t.state == "running" for t in trials()),
                 timeout=300, what="two completed trials and one running")
        running = sum(t.state == "running" for t in trials())
        db.dispose()
        postgres.crash()
        crashed_at = time.time()

        def client_said() -> bool:
            return any("the tuner is unavailable since" in r.getMessage()
                       for r in caplog.records)

        # Down until the service and the notebook client have said so and the outage has
        # lasted its length.
        wait_for(lambda: MESSAGE in hub.log.read_text(errors="replace"), timeout=120,
                 what="the service's message")
        wait_for(client_said, timeout=120, what="the notebook client's message")
        wait_for(lambda: time.time() > crashed_at + DOWN_SECONDS, timeout=DOWN_SECONDS + 5,
                 what="the outage's length")
        assert not watched, watched  # still watching: no call gave up
        postgres.start()
        restarted_at = time.time()
        wait_for(lambda: "database reachable again" in hub.log.read_text(errors="replace"),
                 timeout=300, what="the service to carry on")
        recovered_at = time.time()
        watcher.join(timeout=600)
        assert watched == [sweep], watched  # watch() returned normally, with the sweep
        assert sweep.state == "completed", sweep.info
        detail = sweep.trial_list()
        log = hub.log.read_text(errors="replace")
    # The service said it once in plain words, and once that it was back.
    assert log.count(MESSAGE) == 1, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    said = [r.getMessage() for r in caplog.records if r.name == "tunehub.client"]
    assert len([m for m in said if "unavailable since" in m]) == 1, said
    assert "database unreachable" in said[0], said
    assert any("answers again" in m for m in said), said
    # Trials went on through the outage: they sent reports while the database was down.
    sent = [float(p.read_text()) for p in record.iterdir()]
    assert any(crashed_at < t < restarted_at for t in sent), (crashed_at, sorted(sent))
    assert sorted(t["number"] for t in detail) == list(range(TRIALS)), detail
    assert all(t["state"] == "completed" for t in detail), detail
    assert all(t["attempts"] == 1 for t in detail), detail  # none started again
    for t in detail:
        assert [r["step"] for r in t["intermediate_values"]] == list(range(1, STEPS + 1)), t

    assert_nothing_lost(db, postgres.url, sweep.id, detail)
    record_fault(FaultRecord(
        fault="PostgreSQL crashed (`pg_ctl stop -m immediate`) mid-sweep, sweep run by the "
              "tuner service, watched from a notebook (`Sweep.submit`, `watch()`)",
        duration_s=round(restarted_at - crashed_at, 1), sweeps=1, trials=TRIALS,
        running=running, lost=0, recover_s=round(recovered_at - restarted_at, 1),
        seen="the service's log and the notebook each said once that the database was "
             "unreachable (the notebook: \"the tuner is unavailable since …, retrying\") and "
             "that it was back; watch() returned when the sweep completed"))


def test_the_notebook_client_waits_an_outage_out_as_long_as_the_controllers() -> None:
    """One bound for every side (``tunehub_base.outage``): a notebook call, a trial's report
    and a controller give up on an outage at the same time, and each outlasts a 5-minute
    database restart (issue 29's longer figure) with room to spare."""
    import tuner.db.outage
    import tuner.sdk.client
    import tuner.sdk.training

    assert tuner.sdk.client.OUTAGE_SECONDS is OUTAGE_SECONDS
    assert tuner.sdk.training.REPORT_PATIENCE_SECONDS == OUTAGE_SECONDS
    assert tuner.db.outage.OUTAGE_SECONDS is OUTAGE_SECONDS
    assert OUTAGE_SECONDS >= 2 * 300

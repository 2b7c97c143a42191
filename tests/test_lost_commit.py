"""A commit whose answer is lost: the transaction committed, the connection died before its
client heard so, and the client, waiting an outage out, runs the transaction again.

This is the outage's worst moment for a retry (issue 29): a retry that is merely "safe after a
failure" adds a second Optuna trial, starts an attempt twice or counts a result twice. The test
puts a TCP relay between tunehub and the real PostgreSQL that passes every statement through
and, every few ``COMMIT``\\ s, lets the commit reach the server, then cuts the connection when
the server's answer comes back. A whole sweep runs through it on the controller's real path
(ledger, Optuna mirror, report writer; trials played in-process) and must end as without the
fault: exactly its trials, each number once, each counted once, Optuna's study equal to ours.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
import pytest
from optuna.trial import TrialState as OptunaTrialState

from tests.fault_records import FaultRecord
from tests.fault_records import record as record_fault
from tests.test_controller import ALICE, GUARD_SECONDS, Lab, assert_in_step_with_optuna
from tunehub_base.ports import unclaimed_port
from tuner.backends.instant import quadratic_script
from tuner.db import SweepRow
from tuner.db.outage import unreachable, waiting_out_outages
from tuner.lifecycle.states import SweepState, TrialState
from tuner.search.study import create_study, forget_storages, new_study_name, storage_for
from tuner.spec import SweepSpec

#: A simple-protocol ``COMMIT`` as psycopg sends it: 'Q', the length (4 + 7), the statement.
COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"
#: What a transaction writes, by statement: the table, and for an update the columns it sets.
WRITE = re.compile(
    rb"INSERT INTO (\w+)|UPDATE (\w+ SET (?:\w+=[$\w:()]+(?:, )?)+)|DELETE FROM (\w+)")


class AnswerCutter:
    """A relay to PostgreSQL that, while armed, loses the answer of the first commit of each
    kind of write (the statements the transaction sent, by table and updated columns): it
    passes the ``COMMIT`` on, and cuts the connection when the server answers it. Each kind
    of write is thus retried once after a commit that landed, whichever code path makes it,
    and every later one goes through (an outage that ends)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.armed = False
        self.only = b""  # cut only kinds of write that start with this
        #: True: the cut commit reaches the server, its answer is lost; False: the connection
        #: is cut before the commit is sent, and the server rolls the transaction back.
        self.land = True
        self.cut: list[bytes] = []  # the kinds of write whose commit answer was lost
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", unclaimed_port()))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            doomed = threading.Event()  # a commit to cut has gone to the server
            threading.Thread(target=self._requests, args=(client, server, doomed),
                             daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client, doomed),
                             daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket,
                  doomed: threading.Event) -> None:
        tail, writes = b"", set()
        while data := _recv(client):
            seen = tail + data
            writes |= {b"".join(m.groups(b"")) for m in WRITE.finditer(data)}
            if COMMIT in seen:
                with self._lock:
                    new = sorted(w for w in writes - set(self.cut) if w.startswith(self.only))
                    if self.armed and new:
                        self.cut += new
                        doomed.set()
                        if not self.land:
                            break
                writes = set()
            tail = seen[-len(COMMIT):]
            try:
                server.sendall(data)
            except OSError:
                break
        _close(client, server)

    def _answers(self, server: socket.socket, client: socket.socket,
                 doomed: threading.Event) -> None:
        while data := _recv(server):
            if doomed.is_set():  # the commit is done on the server: its answer never arrives
                break
            try:
                client.sendall(data)
            except OSError:
                break
        _close(client, server)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


@pytest.fixture
def cutter(pg_schema_url: str) -> Iterator[tuple[AnswerCutter, str]]:
    parts = urlsplit(pg_schema_url)
    relay = AnswerCutter((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = f"{parts.username}@127.0.0.1:{relay.port}"
    yield relay, urlunsplit(parts._replace(netloc=netloc))
    relay.close()


@pytest.fixture
async def lab(tmp_path: Path, cutter: tuple[AnswerCutter, str]) -> AsyncIterator[Lab]:
    _, url = cutter
    lab = Lab(tmp_path, url)
    lab.backend.script = quadratic_script(steps=3)
    yield lab
    for engine in lab.engines:
        await engine.close()
    lab.db.dispose()
    storage_for(url).engine.dispose()
    forget_storages()


async def test_a_sweep_whose_commit_answers_are_lost_ends_with_each_trial_once(
        lab: Lab, cutter: tuple[AnswerCutter, str]) -> None:
    relay, _ = cutter
    trials = 8
    sweep_id = lab.submit(trials=trials, parallelism=2, sampler="tpe", pruner="median")
    engine = await lab.engine()
    relay.armed = True
    began = time.monotonic()
    with waiting_out_outages():  # as the CLI's controller does
        state = await asyncio.wait_for(engine.run_sweep(sweep_id), GUARD_SECONDS * 2)
    relay.armed = False
    took = time.monotonic() - began
    # Every kind of write of a sweep lost a commit answer once: Optuna's trial (its
    # parameters, its state and value), tunehub's trial row (asked, started, reported,
    # ended), the reports, the sweep's counters.
    kinds = {kind.split(b" ")[0].decode() for kind in relay.cut}
    assert {"trials", "trial_params", "trial_values", "trial_intermediate_values",
            "tunehub_trials", "tunehub_trial_reports", "tunehub_sweeps"} <= kinds, kinds
    assert any(b"attempts=" in kind for kind in relay.cut)  # an attempt started
    assert any(b"finished_at=" in kind for kind in relay.cut)  # a trial ended
    assert state == SweepState.COMPLETED
    rows = lab.trials(sweep_id)
    assert sorted(rows) == list(range(trials))  # each number once
    assert all(r.attempts == 1 and r.state in (TrialState.COMPLETED, TrialState.PRUNED)
               for r in rows.values()), {n: (r.state, r.attempts) for n, r in rows.items()}
    sweep = lab.ledger.sweep(sweep_id)
    assert sweep.n_started == trials
    assert sweep.n_completed + sweep.n_pruned == trials, (sweep.n_completed, sweep.n_pruned)
    theirs = lab.optuna(sweep_id)
    assert sorted(theirs) == list(range(trials)), "Optuna holds a trial twice"
    assert all(t.state in (OptunaTrialState.COMPLETE, OptunaTrialState.PRUNED)
               for t in theirs.values())
    assert_in_step_with_optuna(lab, sweep_id)
    record_fault(FaultRecord(
        fault=f"commit answers lost ({len(relay.cut)} kinds of write, each once)",
        duration_s=took, sweeps=1, trials=trials, running=2, lost=0, recover_s=0.0,
        seen="the controller's log: database unreachable, retrying; then reachable again"))


def test_a_submission_whose_commit_answer_is_lost_is_made_once(
        tmp_path: Path, cutter: tuple[AnswerCutter, str]) -> None:
    """The sweep's row committed, the answer lost: the submission must leave the sweep
    whole (its code snapshot and its study: no clean-up of what committed) and the same
    request sent again (the notebook client resends a 503 with the same Idempotency-Key)
    must answer that sweep, not make a second."""
    relay, url = cutter
    lab = Lab(tmp_path, url)
    spec = SweepSpec.from_dict({
        "name": "once", "command": "python -c pass", "metric": "score", "trials": 2,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, "code": str(tmp_path)})
    relay.only, relay.armed = b"tunehub_sweeps", True
    try:
        with pytest.raises(Exception) as lost:
            lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1")
        assert unreachable(lost.value), lost.value  # the API answers it 503
        assert b"tunehub_sweeps" in relay.cut  # the transaction that inserts the sweep
        again = lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1")
        (only,) = lab.store.list(ALICE)
        assert again.id == only.id and again.state == SweepState.QUEUED
        assert Path(again.code_dir or "").is_dir()  # the snapshot: the clean-up left it
        assert optuna.load_study(study_name=again.study_name, storage=url).trials == []
        # Another request (another key, or none) is another sweep.
        other = lab.store.submit(spec, ALICE, lab.backend, request_key="submit-2")
        assert other.id != again.id and len(lab.store.list(ALICE)) == 2
    finally:
        lab.db.dispose()
        storage_for(url).engine.dispose()
        forget_storages()


def test_a_submission_whose_commit_never_landed_leaves_no_second_study(
        tmp_path: Path, cutter: tuple[AnswerCutter, str]) -> None:
    """The database went away before the sweep's row committed, after the submission had
    created its Optuna study: the same request sent again makes the sweep once and with that
    study (named by the request's key), so no unused study is left behind; a submission with
    another key has a study of its own."""
    relay, url = cutter
    lab = Lab(tmp_path, url)
    spec = SweepSpec.from_dict({
        "name": "never", "command": "python -c pass", "metric": "score", "trials": 2,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, "code": str(tmp_path)})
    relay.only, relay.land, relay.armed = b"tunehub_sweeps", False, True
    try:
        with pytest.raises(Exception) as lost:
            lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1")
        assert unreachable(lost.value), lost.value
        assert b"tunehub_sweeps" in relay.cut
        assert lab.store.list(ALICE) == []  # rolled back: no sweep
        (left,) = optuna.get_all_study_names(url)  # but the study it created before
        again = lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1")
        assert [s.id for s in lab.store.list(ALICE)] == [again.id]
        assert again.study_name == left and optuna.get_all_study_names(url) == [left]
        other = lab.store.submit(spec, ALICE, lab.backend, request_key="submit-2")
        assert sorted(optuna.get_all_study_names(url)) == sorted([left, other.study_name])
        assert other.study_name != left
    finally:
        lab.db.dispose()
        storage_for(url).engine.dispose()
        forget_storages()


def test_the_second_of_two_submissions_sent_at_once_keeps_the_first_ones_study(
        tmp_path: Path, cutter: tuple[AnswerCutter, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tries of one request at once (a client that timed out and sent it again while the
    first was being made): both load the key's study, the later row loses to the earlier on
    the key, and that try answers the earlier sweep without deleting the study it runs on.
    The race is made certain: while one try copies its code snapshot (after it looked for
    its key and found none), the other try is made whole."""
    _, url = cutter
    lab = Lab(tmp_path, url)
    spec = SweepSpec.from_dict({
        "name": "twice", "command": "python -c pass", "metric": "score", "trials": 2,
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, "code": str(tmp_path)})
    copy = lab.backend.snapshot_code
    made: list[SweepRow] = []
    other_try = iter([True])  # the first copy is the later try's; it lets the other one in

    def copy_while_the_other_try_commits(*args: Any) -> None:
        if next(other_try, False):
            made.append(lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1"))
        copy(*args)

    monkeypatch.setattr(lab.backend, "snapshot_code", copy_while_the_other_try_commits)
    try:
        later = lab.store.submit(spec, ALICE, lab.backend, request_key="submit-1")
        (first,) = made
        assert later.id == first.id and [s.id for s in lab.store.list(ALICE)] == [first.id]
        assert optuna.get_all_study_names(url) == [first.study_name]
        assert Path(first.code_dir or "").is_dir()
    finally:
        lab.db.dispose()
        storage_for(url).engine.dispose()
        forget_storages()


def test_a_request_changed_under_the_same_key_does_not_load_the_other_directions_study(
        tmp_path: Path, cutter: tuple[AnswerCutter, str]) -> None:
    """A first try that created its study (maximize) and lost the database, then the same key
    with the direction changed: the sweep gets a study that minimizes, not the loaded one."""
    _, url = cutter
    lab = Lab(tmp_path, url)
    base = {"name": "turned", "command": "python -c pass", "metric": "score", "trials": 2,
            "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}}, "code": str(tmp_path)}
    first = SweepSpec.from_dict({**base, "direction": "maximize"})
    try:
        create_study(first, new_study_name(first, ALICE.name, "submit-1"), url, owner=ALICE.name)
        turned = lab.store.submit(SweepSpec.from_dict({**base, "direction": "minimize"}), ALICE,
                                  lab.backend, request_key="submit-1")
        study = optuna.load_study(study_name=turned.study_name, storage=url)
        assert study.direction == optuna.study.StudyDirection.MINIMIZE
    finally:
        lab.db.dispose()
        storage_for(url).engine.dispose()
        forget_storages()

"""Everyone sees the pool: who holds each GPU (``tunehub pool``, ``GET api/v1/pool``, metrics)
and the GPU-hours allocated (``tunehub usage``), with real processes taking GPUs through the
real :class:`tunehub_base.gpus.GpuPool` (GPU ids as lock files; no CUDA needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Home
from tests.polling import wait_for
from tests.service_fixtures import TunerHub, running_tuner_hub
from tunehub_base.gpu_holders import LEDGER, Holder, HolderBook, record_name

# A holder: takes COUNT GPUs as the holder described in argv, says which, and holds them
# until told to release (a line on stdin) or killed.
HOLDER = """
import json, sys
from tunehub_base.gpus import GpuPool, discover_gpus
from tunehub_base.gpu_holders import Holder
from tunehub_base.settings import load_settings
spec = json.loads(sys.argv[1])
pool = GpuPool(load_settings().gpu_locks_dir, discover_gpus()[0])
gpus = pool.acquire(spec.pop("count"), Holder(**spec))
print(json.dumps(gpus), flush=True)
if gpus is None:
    sys.exit(3)
sys.stdin.readline()
pool.release(gpus)
print("released", flush=True)
"""


class Holding:
    def __init__(self, env: dict[str, str], count: int = 1, **holder: Any) -> None:
        holder["groups"] = list(holder.get("groups", ()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, json.dumps({"count": count, **holder})], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.gpus = json.loads(self.proc.stdout.readline())  # the holder says when it holds
        assert self.gpus, f"holder {holder} got no GPU"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"
        assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def two_gpu_home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home", f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
                extra_env={"TUNEHUB_LOCAL_GPUS": "0,1"})


@pytest.fixture
def holders() -> Iterator[list[Holding]]:
    started: list[Holding] = []
    yield started
    for holding in started:
        holding.stop()


def _pool(home: Home) -> dict[str, Any]:
    proc = home.cli("pool", "--json", check=True)
    return {g["gpu"]: g for g in json.loads(proc.stdout)["gpus"]}


def test_pool_names_holders_frees_the_dead_and_usage_sums_the_intervals(
    two_gpu_home: Home, holders: list[Holding]
) -> None:
    home = two_gpu_home
    env = home.env
    assert {g: r["state"] for g, r in _pool(home).items()} == {"0": "free", "1": "free"}

    ann = Holding(env, person="ann", kind="notebook", server="", groups=["vision"])
    holders.append(ann)
    bob = Holding(env, person="bob", kind="trial", sweep_id=7, trial=3, attempt=1)
    holders.append(bob)
    assert sorted(ann.gpus + bob.gpus) == ["0", "1"]

    pool = _pool(home)
    a, b = pool[ann.gpus[0]], pool[bob.gpus[0]]
    assert a["state"] == "held" and a["holder"]["person"] == "ann"
    assert a["holder"]["kind"] == "notebook" and a["holder"]["groups"] == ["vision"]
    assert b["state"] == "held" and b["holder"]["person"] == "bob"
    assert (b["holder"]["sweep_id"], b["holder"]["trial"], b["holder"]["attempt"]) == (7, 3, 1)
    assert b["holder"]["what"] == "sweep 7 trial 3 attempt 1"
    assert a["since"] <= time.time() and a["utilization"] is None
    table = home.cli("pool", check=True).stdout
    assert "ann" in table and "sweep 7 trial 3" in table

    # A holder that dies frees its GPU at once (the kernel drops its lock), though its record
    # is left behind.
    bob.kill()
    lock_dir = home.path / "gpu-locks"
    assert (lock_dir / record_name(bob.gpus[0])).exists()
    wait_for(lambda: _pool(home)[bob.gpus[0]]["state"] == "free", timeout=30,
             what="the killed holder's GPU to read free")
    assert _pool(home)[bob.gpus[0]]["holder"] is None

    ann.release()  # an ended holding: its interval is in the ledger, its GPU free
    assert _pool(home)[ann.gpus[0]]["state"] == "free"
    # The next one to take a GPU closes bob's stale record (at that moment), whichever GPU it
    # takes: cat gets ann's, the first free one.
    cat = Holding(env, person="cat", kind="notebook", server="big")
    holders.append(cat)
    assert cat.gpus == ann.gpus
    assert not (lock_dir / record_name(bob.gpus[0])).exists()

    ledger = [json.loads(line) for line in (lock_dir / LEDGER).read_text().splitlines()]
    by_person = {line["person"]: line for line in ledger}
    assert sorted(by_person) == ["ann", "bob"]
    assert by_person["bob"].get("stale") is True and "stale" not in by_person["ann"]
    hours = {p: (line["end"] - line["start"]) / 3600 for p, line in by_person.items()}

    before = time.time()
    usage = json.loads(home.cli("usage", "--since", "2026-01-01", "--json", check=True).stdout)
    after = time.time()
    assert usage["person"]["ann"] == pytest.approx(hours["ann"])
    assert usage["person"]["bob"] == pytest.approx(hours["bob"])
    cat_since = _pool(home)[cat.gpus[0]]["since"]
    assert (before - cat_since) / 3600 <= usage["person"]["cat"] <= (after - cat_since) / 3600
    assert usage["group"] == {"vision": pytest.approx(hours["ann"])}
    assert usage["sweep"] == {"7": pytest.approx(hours["bob"])}
    assert usage["notebook"]["ann"] == pytest.approx(hours["ann"])
    assert usage["notebook"]["cat/big"] == usage["person"]["cat"]
    assert usage["gpu_hours"] == pytest.approx(sum(usage["person"].values()))
    # A period after everything ended counts only what is still held.
    later = json.loads(home.cli("usage", "--since", time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.gmtime(after + 3600)), "--json", check=True).stdout)
    assert later["gpu_hours"] == 0 and later["person"] == {}
    text = home.cli("usage", "--since", "2026-01-01", check=True).stdout
    assert "ann" in text and "by sweep" in text

    bad = home.cli("usage", "--since", "last tuesday")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "since:" in bad.stderr


def test_records_are_never_followed(tmp_path: Path) -> None:
    """A link planted where a record or the ledger goes is replaced or refused, never written
    through or read through."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    target = tmp_path / "precious"
    target.write_text("mine")
    (lock_dir / record_name("0")).symlink_to(target)
    book = HolderBook(lock_dir)
    assert book._record("0", os.open(lock_dir, os.O_RDONLY)) is None
    holding = book.taken("0", Holder.notebook("ann"))
    assert target.read_text() == "mine" and not (lock_dir / record_name("0")).is_symlink()
    (lock_dir / LEDGER).unlink()
    (lock_dir / LEDGER).symlink_to(target)
    with pytest.raises(OSError):
        book.released("0", holding.id)
    assert target.read_text() == "mine"
    with pytest.raises(OSError):
        book.close_stale(["0"])  # ann's record, no lock held: stale, but the ledger is a link
    assert target.read_text() == "mine"


READ = ["custom:tuner:read", "access:services!service=tuner"]


def test_everyone_reads_the_pool_nobody_changes_it(tmp_path: Path, holders: list[Holding]) -> None:
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
                           extra_env={"TUNEHUB_LOCAL_GPUS": "0,1"}) as hub:
        _pool_routes(hub, holders)


def _pool_routes(hub: TunerHub, holders: list[Holding]) -> None:
    env = {**os.environ, **hub.env}
    alice = Holding(env, person="alice", kind="trial", sweep_id=1, trial=0, attempt=1)
    holders.append(alice)
    bob = hub.client(hub.token("bob", READ))
    pool = bob.get("pool")
    assert pool.status_code == 200, pool.text
    gpus = {g["gpu"]: g for g in pool.json()["gpus"]}
    assert gpus[alice.gpus[0]]["holder"]["person"] == "alice"  # public inside the lab
    usage = bob.get("usage", params={"since": "2026-01-01"})
    assert usage.status_code == 200 and usage.json()["person"]["alice"] > 0
    assert bob.get("usage").status_code == 400
    assert bob.get("usage", params={"since": "soon"}).json()["field"] == "since"
    # Reading is all there is: every other method is refused and nothing changes.
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("pool", "usage"):
            r = bob.request(method, path, json={"gpu": alice.gpus[0], "state": "free"})
            assert r.status_code == 405, (method, path, r.text)
    after = bob.get("pool").json()["gpus"]
    assert {g["gpu"]: (g["state"], g["holder"]) for g in after} == {
        g: (r["state"], r["holder"]) for g, r in gpus.items()}
    assert alice.proc.poll() is None
    # Nobody logged in: nothing at all.
    assert httpx.get(f"{hub.api}pool", timeout=30).status_code == 401
    metrics = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                        headers={"Authorization": f"token {hub.admin_token}"})
    assert metrics.status_code == 200
    assert f'tunehub_gpu_held{{gpu="{alice.gpus[0]}",kind="trial"}} 1.0' in metrics.text
    assert 'tunehub_gpu_allocated_seconds_total{kind="trial",person="alice"}' in metrics.text

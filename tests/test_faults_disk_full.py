"""The model registry fills up (ENOSPC): the sweep's promotion fails with a clear reason, the
database stays consistent (no version row), the registry holds no half-written version (the
model is written whole into a staging directory, then renamed), and the next promotion works
once space is back.

The data store fills up under trials (issue 29: "the trial ... fails with a clear reason"): a
trial whose checkpoint or model meets ``ENOSPC`` fails with a reason that says the disk is full,
the database (tunehub's rows and Optuna's study) stays consistent, and the next sweep works once
space is back.

The registry and the data store are real small filesystems: a tmpfs mounted with ``size=`` (as
root), grown afterwards with ``mount -o remount``, as an operator would free or add space.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from sqlalchemy import select

from tests.conftest import Home
from tests.fault_records import FaultRecord, record
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL, parse_json, write_sweep
from tuner.backends.local.no_space import no_space_reason
from tuner.db import Database, ModelVersion, SweepRow, Trial
from tuner.serving.registry import Registry, RegistryError

MODEL_BYTES = 600 * 1024  # the model's variables: more than the small registry holds
FULL_SIZE, ROOMY_SIZE = "256k", "4m"

TRAIN = f"""\
import os, pathlib, tuner
p = tuner.params()
model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
(model / "variables").mkdir(parents=True, exist_ok=True)
(model / "saved_model.pb").write_bytes({MINIMAL_SAVED_MODEL!r})
(model / "variables" / "variables.data-00000-of-00001").write_bytes(b"w" * {MODEL_BYTES})
tuner.report(p["x"])
"""


@pytest.fixture
def small_registry(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``FULL_SIZE`` bytes (mounting one needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    root = tmp_path / "registry"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_SIZE}", "tmpfs", str(root)],
                   check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_registry_full_fails_the_promotion_cleanly_then_works(
    sqlite_home: Home, small_registry: Path, tmp_path: Path
) -> None:
    sqlite_home.extra_env["TUNEHUB_REGISTRY"] = str(small_registry)
    spec = write_sweep(tmp_path / "code", TRAIN, trials=2, parallelism=1, sampler="random",
                       promote={"model": "big", "policy": "always"})

    began = time.monotonic()
    full = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    first = parse_json(full.stdout)
    # The trials are done; the promotion failed and the sweep says why, in plain words.
    assert first["state"] == "completed", first
    assert "model not registered" in first["reason"], first
    assert "registry is full" in first["reason"], first
    assert "No space left on device" in first["reason"], first
    assert first["model_version_id"] is None, first
    # Nothing half-written is left in the registry: no version, no staging directory.
    left = sorted(str(p.relative_to(small_registry)) for p in small_registry.rglob("*")
                  if p.name != "models.config")
    assert left in ([], ["big"]), left
    db = Database(sqlite_home.db_url, migrate=False)
    try:
        with db.session() as s:
            assert list(s.scalars(select(ModelVersion))) == []
    finally:
        db.dispose()
    listed = sqlite_home.cli("model", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [m for m in parse_json(listed.stdout) if m["versions"]] == [], listed.stdout

    # Space is back: the next sweep's model is registered and promoted, whole.
    subprocess.run(["mount", "-o", f"remount,size={ROOMY_SIZE}", str(small_registry)],
                   check=True)
    freed = time.monotonic()
    roomy = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=600)
    assert roomy.returncode == 0, roomy.stderr[-3000:]
    second = parse_json(roomy.stdout)
    assert second["state"] == "completed", second
    assert "big v1 promoted to production" in second["reason"], second
    version = small_registry / "big" / "1"
    assert (version / "saved_model.pb").read_bytes() == MINIMAL_SAVED_MODEL
    blob = version / "variables" / "variables.data-00000-of-00001"
    assert blob.stat().st_size == MODEL_BYTES
    assert not [p for p in (small_registry / "big").iterdir() if p.name.startswith(".")]
    record(FaultRecord(
        fault="model registry full (ENOSPC, a 256 KiB tmpfs)",
        duration_s=round(freed - began, 1), sweeps=1, trials=2, running=0, lost=0,
        recover_s=round(time.monotonic() - freed, 1),
        seen="sweep completed with reason \"model not registered: the model registry is full "
             "(No space left on device …)\"; no version, no partial files; the next sweep's "
             "model became v1 and was promoted"))


def test_a_model_that_fits_only_in_part_is_refused_not_truncated(
    small_registry: Path, tmp_path: Path
) -> None:
    """A disk with some room takes part of a big write and says so only by the count: the
    copy writes the rest (and meets ``ENOSPC``) instead of keeping a truncated file as a
    version."""
    source = tmp_path / "sweeps" / "model"
    (source / "variables").mkdir(parents=True)
    (source / "saved_model.pb").write_bytes(MINIMAL_SAVED_MODEL)
    (source / "variables" / "variables.data-00000-of-00001").write_bytes(b"w" * MODEL_BYTES)
    db = Database(f"sqlite:///{tmp_path / 'tunehub.sqlite'}")
    registry = Registry(db, small_registry)
    try:
        with pytest.raises(RegistryError, match="registry is full"):
            registry.register(model="big", source_dir=source, owner="ana", metric="acc",
                              direction="maximize", metric_value=0.5,
                              trusted=tmp_path / "sweeps")
        assert list((small_registry / "big").iterdir()) == []
        with db.session() as s:
            assert list(s.scalars(select(ModelVersion))) == []
    finally:
        db.dispose()


# --- the data store full for a trial ---------------------------------------------------------

STATE_BYTES = 2 * 1024 * 1024  # a checkpoint bigger than the whole small filesystem
DATA_FULL_SIZE, DATA_ROOMY_SIZE = "1m", "16m"

# Trial 0 saves a checkpoint too big for the disk (tuner.checkpoint writes a temporary file and
# removes it when the write fails); trial 1 writes its model in place and leaves the disk full
# (its own output, the traceback, then has no room either). Once there is room, both fit.
TRIAL_TRAIN = f"""\
import os, pathlib, tuner
p = tuner.params()
tuner.report(p["x"], step=1)
if os.environ["TUNEHUB_TRIAL_NUMBER"] == "0":
    tuner.checkpoint({{"weights": b"w" * {STATE_BYTES}}}, step=1)
else:
    model = pathlib.Path(os.environ["TUNEHUB_ARTIFACT_DIR"]) / "model"
    (model / "variables").mkdir(parents=True, exist_ok=True)
    (model / "saved_model.pb").write_bytes({MINIMAL_SAVED_MODEL!r})
    (model / "variables" / "variables.data-00000-of-00001").write_bytes(b"w" * {STATE_BYTES})
tuner.report(p["x"])
"""


@pytest.fixture
def small_data_store(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``DATA_FULL_SIZE`` bytes for tunehub's home and data store (one volume, as
    the chart mounts them), where trials keep their checkpoints and models."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    root = tmp_path / "store"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_FULL_SIZE}", "tmpfs", str(root)],
                   check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_data_store_full_fails_the_trials_clearly_then_works(
    small_data_store: Path, tmp_path: Path
) -> None:
    """The disk holding trials' files (tunehub's home and the data store) fills up under two
    trials: each fails with a reason that says the disk is full, which one and what the trial
    said (not only "exited with code 1"); the sweep ends failed with no trial completed and no
    model; the database (tunehub's rows and Optuna's study) agrees. Once there is room, the
    same sweep runs through and its model is registered and promoted."""
    home = Home(small_data_store / ".tunehub", f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
                extra_env={"TUNEHUB_DATA": str(small_data_store)})
    spec = write_sweep(tmp_path / "code", TRIAL_TRAIN, trials=2, parallelism=1, max_retries=0,
                       sampler="random", promote={"model": "m", "policy": "always"})
    began = time.monotonic()
    full = home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=600)
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    first = parse_json(full.stdout)
    assert full.returncode != 0 and first["state"] == "failed", first
    assert first["reason"].startswith("no trial completed"), first["reason"]
    assert first["model_version_id"] is None, first
    trials = first["trials_detail"]
    assert [(t["number"], t["state"], t["attempts"]) for t in trials] == [
        (0, "failed", 1), (1, "failed", 1)], trials
    for t in trials:
        reason = t["reason"]
        # What, said first, with the trial's own line; how it exited; which disk, how full.
        assert reason.startswith(
            "no space left on device: OSError: [Errno 28] No space left on device"), reason
        assert "exited with code 1" in reason, reason
        assert f"the disk holding its files ({home.path}/sweeps/" in reason, reason
        assert " free of 1.0 MiB" in reason, reason

    # The database is consistent: every row finished, the counters and Optuna's study agree,
    # no model version; the registry holds none either.
    db = Database(home.db_url, migrate=False)
    try:
        with db.session() as s:
            rows = list(s.scalars(select(Trial)))
            sweep = s.get(SweepRow, first["id"])
            assert sweep is not None
            study_name, failed = sweep.study_name, sweep.n_failed
            assert list(s.scalars(select(ModelVersion))) == []
        assert sorted((t.number, t.state) for t in rows) == [(0, "failed"), (1, "failed")]
        assert failed == 2
        study = optuna.load_study(study_name=study_name, storage=db.url)
        assert [(t.number, t.state) for t in study.trials] == [
            (0, optuna.trial.TrialState.FAIL), (1, optuna.trial.TrialState.FAIL)]
    finally:
        db.dispose()
    registry = small_data_store / "models"
    assert not [p for p in registry.rglob("*") if p.name != "models.config"], \
        sorted(registry.rglob("*"))

    # Space is back (the volume grown): the same sweep runs through, its model promoted.
    subprocess.run(["mount", "-o", f"remount,size={DATA_ROOMY_SIZE}", str(small_data_store)],
                   check=True)
    freed = time.monotonic()
    roomy = home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=600)
    assert roomy.returncode == 0, roomy.stderr[-3000:]
    second = parse_json(roomy.stdout)
    assert second["state"] == "completed", second
    assert [(t["state"], t["reason"]) for t in second["trials_detail"]] == [
        ("completed", None), ("completed", None)], second["trials_detail"]
    assert "m v1 promoted to production" in second["reason"], second
    blob = registry / "m" / "1" / "variables" / "variables.data-00000-of-00001"
    assert blob.stat().st_size == STATE_BYTES
    record(FaultRecord(
        fault="data store full (ENOSPC, a 1 MiB tmpfs) under trials writing a checkpoint "
              "and a model",
        duration_s=round(freed - began, 1), sweeps=1, trials=2, running=1, lost=0,
        recover_s=round(time.monotonic() - freed, 1),
        seen="each trial failed with \"no space left on device: OSError: [Errno 28] No space "
             "left on device; exited with code 1; the disk holding its files (…) has … free "
             "of 1.0 MiB now\"; the sweep failed with no model, the database and Optuna "
             "agreeing; the next sweep completed and promoted its model"))


def test_a_log_the_full_disk_refused_is_said_too(small_data_store: Path) -> None:
    """The trial's output gone for want of room (its log refused it) is reason enough to say
    the disk is full; a failure that names no full disk keeps its plain reason."""
    refused = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert no_space_reason("exited with code 1", b"epoch 3\n", refused, small_data_store) == (
        "no space left on device; its log could not take its output; exited with code 1; "
        f"the disk holding its files ({small_data_store}) has 1.0 MiB free of 1.0 MiB now")
    assert no_space_reason("exited with code 1", b"ValueError: bad\n", None,
                           small_data_store) is None

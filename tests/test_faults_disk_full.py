"""The model registry fills up (ENOSPC): the sweep's promotion fails with a clear reason, the
database stays consistent (no version row), the registry holds no half-written version (the
model is written whole into a staging directory, then renamed), and the next promotion works
once space is back.

The registry is a real small filesystem: a tmpfs mounted with ``size=`` (as root), grown
afterwards with ``mount -o remount``, as an operator would free or add space.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.conftest import Home
from tests.fault_records import FaultRecord, record
from tests.sweeps_helpers import MINIMAL_SAVED_MODEL, parse_json, write_sweep
from tuner.db import Database, ModelVersion
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

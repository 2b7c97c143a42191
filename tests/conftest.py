"""Shared fixtures: a tunehub home per test, and the database under test (SQLite file and a
fresh schema in the real PostgreSQL on 127.0.0.1:5432)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

pytest_plugins = ["tests.service_fixtures", "tests.hub_fixtures", "kubesim.fixtures"]

PG_BASE = os.environ.get("TUNEHUB_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parent.parent
TUNEHUB = str(Path(sys.executable).parent / "tunehub")


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A fresh schema per test in the shared PostgreSQL: tests never see each other's rows and
    parallel runs never collide."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    yield f"{PG_BASE}?options=-csearch_path%3D{schema}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tunehub.sqlite'}"
    return request.getfixturevalue("pg_schema_url")


@dataclass
class Home:
    """A tunehub installation in a temporary directory, driven through the real CLI."""

    path: Path
    db_url: str
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TUNEHUB_HOME": str(self.path),
                "TUNEHUB_DB_URL": self.db_url,
                "TUNEHUB_LOCAL_GPUS": "",
                "TF_CPP_MIN_LOG_LEVEL": "2",
            }
        )
        env.update(self.extra_env)
        return env

    def cli(
        self, *args: str, check: bool = False, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [TUNEHUB, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"tunehub {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [TUNEHUB, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def home(tmp_path: Path, db_url: str) -> Home:
    return Home(tmp_path / "home", db_url)


@pytest.fixture
def sqlite_home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home", f"sqlite:///{tmp_path / 'tunehub.sqlite'}")


@pytest.fixture(autouse=True)
def _log_repeat_filters_end_with_their_test() -> Iterator[None]:
    """Loading the hub's config puts a repeat filter on the handlers, pytest's own included;
    one test's warning must not silence the same warning in the next test."""
    yield
    from hub.log_limits import unlimit_repeats

    unlimit_repeats()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None],
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran a platform (``platform``, ``readme_platform``) carries the end of
    its hub's log (the proxy and the tuner log there too): a CI failure in a browser is
    explained by what the servers said, which is gone with the test's directories."""
    report = yield
    if call.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in ("platform", "readme_platform"):
            running = funcargs.get(name)
            if running is not None and hasattr(running, "hub_log"):
                report.sections.append((f"{name}: the end of the hub's log",
                                        running.hub_log()))
    return report

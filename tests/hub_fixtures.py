"""The whole platform as a user starts it: ``tunehub up`` (real JupyterHub, proxy, tuner
service, idle culler) on free ports with its state in a temporary ``TUNEHUB_HOME``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.service_fixtures import free_port

REPO = Path(__file__).resolve().parent.parent
TUNEHUB = str(Path(sys.executable).parent / "tunehub")


@dataclass
class Platform:
    url: str
    home: Path
    data: Path
    env: dict[str, str]
    port: int
    process: subprocess.Popen[str] | None = None
    output: str = ""
    password: str | None = None

    def start(self) -> Platform:
        """Run ``tunehub up`` and wait for its announcement (the hub answers by then)."""
        self.process = subprocess.Popen(
            [TUNEHUB, "up", "--port", str(self.port)], env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        lines: list[str] = []
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        self.output = "".join(lines)
        if self.process.poll() is not None or "tunehub is up" not in self.output:
            raise AssertionError(f"tunehub up failed:\n{self.output}\n{self.hub_log()}")
        found = re.search(r"login:\s+admin / (\S+)", self.output)
        if found:
            self.password = found.group(1)
        wait_for(self._tuner_ready, timeout=120, what="the tuner service behind the hub")
        return self

    def _tuner_ready(self) -> bool:
        try:
            r = httpx.get(f"{self.url}services/tuner/api/v1/openapi.json", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def stop(self) -> int:
        """Ctrl-C, as a user would; returns tunehub up's exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()
            raise AssertionError("tunehub up did not stop within 90 s of Ctrl-C") from None
        return self.process.returncode

    def hub_log(self) -> str:
        log = self.home / "hub" / "hub.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    """A platform not yet started (``platform.start()``); stopped after the test. The digits
    example is on its data store, as a team's code would be."""
    home, data = tmp_path / "tunehub", tmp_path / "data"
    shutil.copytree(REPO / "examples" / "digits", data / "digits")
    port = free_port()
    env = {
        **os.environ,
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_DATA": str(data),
        "TUNEHUB_LOCAL_GPUS": "",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    env.pop("TUNEHUB_DB_URL", None)
    env.pop("TUNEHUB_API_URL", None)
    p = Platform(f"http://127.0.0.1:{port}/", home, data, env, port)
    try:
        yield p
    finally:
        p.stop()

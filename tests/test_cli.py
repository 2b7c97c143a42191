"""The CLI on bad input: one line, the field named, non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, write_sweep


def _one_line_error(proc, code: int = 2) -> str:  # type: ignore[no-untyped-def]
    assert proc.returncode == code, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("spec_text", "expected"),
    [
        ("name: x\ncommand: c\nmetric: m\nspace: {lr: {type: float, low: 1, high: 0.1}}\n",
         "tunehub: error: space.lr.low: must be below high"),
        ("name: x\ncommand: c\nmetric: m\nparalelism: 2\n"
         "space: {a: {type: int, low: 1, high: 2}}\n",
         "tunehub: error: paralelism: unknown field"),
        ("name: x\ncommand: c\nmetric: m\nspace: {a: {type: categorical, choices: []}}\n",
         "tunehub: error: space.a.choices: expected a non-empty list"),
        ("name: [x\n", "tunehub: error: spec: "),
    ],
)
def test_bad_spec(sqlite_home: Home, tmp_path: Path, spec_text: str, expected: str) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(spec_text)
    line = _one_line_error(sqlite_home.cli("sweep", "run", str(path)))
    assert line.startswith(expected), line


def test_unknown_ids_and_bad_arguments(sqlite_home: Home) -> None:
    assert _one_line_error(sqlite_home.cli("sweep", "show", "999")) == (
        "tunehub: error: sweep 999 not found"
    )
    assert "not found" in _one_line_error(sqlite_home.cli("sweep", "cancel", "999"))
    proc = sqlite_home.cli("sweep", "show", "abc")
    assert proc.returncode == 2 and "sweep id must be a number" in proc.stderr
    proc = sqlite_home.cli("sweep", "run", "x.yaml", "--backend", "slurm")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    assert "cannot read" in _one_line_error(sqlite_home.cli("sweep", "run", "missing.yaml"))


def test_cancel_stops_a_running_sweep(sqlite_home: Home, tmp_path: Path) -> None:
    from tests.polling import wait_for

    script = """
import time, tuner
for step in range(1, 200):
    time.sleep(0.1)  # a long training loop
    tuner.report(0.5, step=step)
"""
    spec = write_sweep(tmp_path / "code", script, trials=4, parallelism=2)
    out = parse_json(sqlite_home.cli("sweep", "run", str(spec), "--json", check=True).stdout)

    def running() -> bool:
        shown = parse_json(sqlite_home.cli("sweep", "show", str(out["id"]), "--json").stdout)
        return sum(t["state"] == "running" for t in shown["trials_detail"]) == 2

    wait_for(running, what="two running trials")
    sqlite_home.cli("sweep", "cancel", str(out["id"]), check=True)

    def cancelled() -> dict | None:
        shown = parse_json(sqlite_home.cli("sweep", "show", str(out["id"]), "--json").stdout)
        return shown if shown["state"] == "cancelled" else None

    shown = wait_for(cancelled, what="the sweep to be cancelled")
    # The two that ran, and the one the controller had asked ahead for the next free slot.
    assert len(shown["trials_detail"]) == 3
    assert {t["state"] for t in shown["trials_detail"]} == {"cancelled"}
    assert sorted(t["attempts"] for t in shown["trials_detail"]) == [0, 1, 1]
    # A cancel made again (its answer lost, say) is answered with the sweep as it is.
    again = sqlite_home.cli("sweep", "cancel", str(out["id"]), "--json", check=True)
    assert parse_json(again.stdout)["state"] == "cancelled"


# Run the CLI with the hub extra's packages unimportable, as after `pip install tunehub`.
WITHOUT_HUB_EXTRA = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"jupyterhub", "traitlets", "kubespawner", "jupyterlab"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_sweeps_need_no_hub_extra(sqlite_home: Home, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", WITHOUT_HUB_EXTRA, *args],
                              env=sqlite_home.env, capture_output=True, text=True, timeout=300)

    spec = write_sweep(tmp_path / "code", "import tuner\ntuner.report(tuner.params()['x'])\n",
                       trials=2)
    out = cli("sweep", "run", str(spec), "--wait", "--json")
    assert out.returncode == 0, out.stderr
    assert parse_json(out.stdout)["completed"] == 2
    up = cli("up")
    assert _one_line_error(up) == ("tunehub: error: tunehub up needs the hub extra (missing "
                                   "module 'traitlets'): pip install 'tunehub[hub]'")

"""A model is a program: measuring what serving it costs never runs it beside the platform's
secrets (#31's class: nothing of the platform reaches a person's code).

The attack: a SavedModel whose serving signature reads ``/proc/self/environ`` and writes it out
(TensorFlow's own ``ReadFile``/``WriteFile`` ops, which any graph may hold). Measured the way
the controller measures every trial's model (:func:`tuner.serving.cost.measure_trial_model`),
the server that runs the graph gets a trial's environment, so the platform's variables (the
database URL, the hub's token, every ``TUNEHUB_*``) are not there to read; and a process that
holds a Kubernetes ServiceAccount token (the tuner in its pod) runs no model at all.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

import pytest

from tests.polling import wait_for
from tuner.serving import cost
from tuner.serving.cost import CostError, CostMethod, ModelProcess, measure_trial_model

QUICK = CostMethod(warmup=1, requests=3)


def _leaky_model(where: Path, loot: Path) -> None:
    """A SavedModel whose every prediction copies the serving process's environment to
    ``loot`` and answers ``2 x``."""
    import tensorflow as tf

    class Leak(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            tf.io.write_file(str(loot), tf.io.read_file("/proc/self/environ"))
            return {"y": x * 2.0}

    module = Leak()
    tf.saved_model.save(module, str(where), signatures={"serving_default": module.serve})


@pytest.mark.slow
def test_the_measured_model_reads_no_platform_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = secrets.token_hex(16)
    for name in ("TUNEHUB_DB_URL", "JUPYTERHUB_API_TOKEN", "TUNEHUB_HUB_SECRET"):
        monkeypatch.setenv(name, f"{name}={secret}")
    monkeypatch.setenv("TUNEHUB_TEST_CANARY", "visible-only-if-inherited")
    trusted = tmp_path / "sweeps"
    model = trusted / "1" / "trials" / "0" / "artifacts" / "model"
    loot = tmp_path / "loot"
    _leaky_model(model, loot)

    figures = measure_trial_model(model, trusted, 50_000_000,
                                  ModelProcess.of_owner(None), QUICK)

    assert figures["serving_latency_p95_ms"] > 0
    seen = loot.read_bytes().decode(errors="replace")
    assert "PATH=" in seen, "the graph ran and read its environment"  # the attack works
    assert secret not in seen and "TUNEHUB_" not in seen and "JUPYTERHUB_" not in seen


def test_a_process_holding_a_service_account_token_runs_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = tmp_path / "serviceaccount" / "token"
    token.parent.mkdir()
    token.write_text("a token")
    monkeypatch.setattr(cost, "SERVICE_ACCOUNT_TOKEN", token)
    trusted = tmp_path / "sweeps"
    model = trusted / "model"
    model.mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"never loaded")
    with pytest.raises(CostError, match="ServiceAccount token"):
        cost.measure(model, ModelProcess(dict(os.environ)), QUICK)


def _tcp_listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    return found


@pytest.mark.slow
def test_the_measuring_server_listens_on_no_port(tmp_path: Path) -> None:
    """Its socket is a Unix one the tuner bound in a directory of its own and handed over:
    nobody else on the machine can reach the model's server or take its address first."""
    trusted = tmp_path / "sweeps"
    model = trusted / "model"
    _leaky_model(model, tmp_path / "loot")
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(figures=measure_trial_model(
        model, trusted, 50_000_000, ModelProcess.of_owner(None), QUICK)))
    worker.start()
    seen: dict[int, set[str]] = {}

    def servers() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"tuner.serving.cost" in cmdline and b"tunehub-cost-" in cmdline:
                    pids.append(int(entry.name))
        return pids

    def serving() -> bool:
        # Once the server answers (the loot is written by its first prediction), look at
        # every socket it holds.
        for pid in servers():
            try:
                seen[pid] = _socket_inodes(pid)
            except OSError:
                continue
        return (tmp_path / "loot").exists() and bool(seen) and any(seen.values())

    wait_for(serving, timeout=300, what="the measuring server to answer")
    listening = _tcp_listening_inodes()
    worker.join(300)
    assert "figures" in result
    assert all(not (inodes & listening) for inodes in seen.values()), seen

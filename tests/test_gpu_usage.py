"""GPUs measured by what they do: the real ``nvidia-ml-py`` loads the NVML stand-in
(``tests/nvml_standin``) in the processes these tests start, and tunehub's sampler, the pool
view, the metrics and a real local sweep read the figures the test writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, Home
from tests.nvml_standin import DRIVER_NOT_LOADED, GPU_IS_LOST, GiB, StandIn, build, idle_gpu
from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.sweeps_helpers import parse_json, record_dir, write_sweep
from tunehub_base.gpu_meter import UseMeter, UsePolicy
from tunehub_base.gpu_usage import LOST, NO_LIBRARY, GpuReading


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def standin(nvml_library: Path, tmp_path: Path) -> StandIn:
    return StandIn(nvml_library.parent, tmp_path / "nvml-figures")


# Readings taken in a process of their own (NVML is loaded once per process): each line of
# stdin is a list of GPU ids, each answer a line of JSON; one Sampler for all, as the tuner
# keeps one, so figures that change between two lines are read afresh.
READER = """
import json, sys
from tunehub_base.gpu_usage import Sampler, sample
sampler = Sampler()
for line in sys.stdin:
    ids = json.loads(line)
    got = sampler.sample(ids) if ids else sample(["0"])
    print(json.dumps({g: r.to_json() for g, r in got.items()}), flush=True)
"""


class Reader:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER], env={**_base_env(), **env}, cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self, *ids: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(list(ids)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the reader died"
        return dict(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH",
                                                           "NVML_STANDIN_FIGURES")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_figures_are_read_live_and_a_lost_gpu_is_a_reason(standin: StandIn) -> None:
    standin.set({"util": 85, "mem_used": 3 * GiB, "mem_total": 16 * GiB, "pids": [4242, 77],
                 "name": "Stand-in-A100"},
                idle_gpu(uuid="GPU-5f1c"))
    reader = Reader(standin.env)
    try:
        got = reader.read("0", "GPU-5f1c", "7")
        assert got["0"] == {"gpu": "0", "utilization": 0.85, "memory_used_bytes": 3 * GiB,
                            "memory_total_bytes": 16 * GiB, "pids": [77, 4242],
                            "absent": None, "name": "Stand-in-A100"}
        assert got["GPU-5f1c"]["utilization"] == 0.0 and got["GPU-5f1c"]["pids"] == []
        assert got["7"]["absent"] == "NVML has no GPU 7" and got["7"]["utilization"] is None

        # The same sampler sees the figures change; a GPU that falls off the bus is a reason,
        # the other GPU is still read.
        standin.set({"util": 0, "mem_used": 0, "mem_total": 16 * GiB, "error": GPU_IS_LOST},
                    idle_gpu(util=40, uuid="GPU-5f1c"))
        got = reader.read("0", "GPU-5f1c")
        assert got["0"]["absent"] == LOST and got["0"]["utilization"] is None
        assert got["GPU-5f1c"]["utilization"] == 0.4
        # ... and once it is back, it is read again.
        standin.set(idle_gpu(util=10))
        assert reader.read("0")["0"]["utilization"] == 0.1
        assert reader.read()["0"]["utilization"] == 0.1  # the one-shot reading too
    finally:
        reader.close()


def test_no_library_or_no_driver_is_absent_with_the_reason(standin: StandIn) -> None:
    reader = Reader({})  # no stand-in on the library path: no libnvidia-ml.so.1 at all
    try:
        got = reader.read("0", "1")
        assert {g: r["absent"] for g, r in got.items()} == {"0": NO_LIBRARY, "1": NO_LIBRARY}
        assert got["0"]["utilization"] is None and got["0"]["pids"] == []
    finally:
        reader.close()
    standin.set(idle_gpu(), init_error=DRIVER_NOT_LOADED)
    reader = Reader(standin.env)
    try:
        assert reader.read("0")["0"]["absent"] == "NVML not available: Driver Not Loaded"
        standin.set(idle_gpu(util=30))  # the driver came back: the next reading has figures
        assert reader.read("0")["0"]["utilization"] == 0.3
    finally:
        reader.close()


METRICS = """
import sys
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
from tuner.metrics import watch_gpu_pool
registry = CollectorRegistry()
watch_gpu_pool(sys.argv[1], registry)
sys.stdout.write(generate_latest(registry).decode())
"""


def test_pool_view_and_metrics_show_what_each_gpu_does(standin: StandIn, tmp_path: Path) -> None:
    home = Home(tmp_path / "home", f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
                extra_env={"TUNEHUB_LOCAL_GPUS": "0,1", **standin.env})
    standin.set({"util": 63, "mem_used": 5 * GiB, "mem_total": 16 * GiB, "pids": [31337]},
                {"util": 0, "error": GPU_IS_LOST})
    pool = {g["gpu"]: g for g in parse_json(home.cli("pool", "--json", check=True).stdout)["gpus"]}
    assert pool["0"]["utilization"] == 0.63 and pool["0"]["pids"] == [31337]
    assert (pool["0"]["memory_used_bytes"], pool["0"]["memory_total_bytes"]) == (5 * GiB, 16 * GiB)
    assert pool["0"]["measure_absent"] is None
    assert pool["1"]["utilization"] is None and pool["1"]["measure_absent"] == LOST
    table = home.cli("pool", check=True).stdout
    assert "63%" in table and "5.0 of 16.0 GiB" in table and "not measured: GPU lost" in table

    metrics = subprocess.run(
        [sys.executable, "-c", METRICS, str(home.path / "gpu-locks")], env=home.env, cwd=REPO,
        capture_output=True, text=True, timeout=120, check=True).stdout
    samples = {(s.name, s.labels.get("gpu")): s.value
               for family in text_string_to_metric_families(metrics) for s in family.samples}
    assert samples[("tunehub_gpu_utilization_ratio", "0")] == 0.63
    assert samples[("tunehub_gpu_memory_used_bytes", "0")] == 5 * GiB
    assert ("tunehub_gpu_utilization_ratio", "1") not in samples  # lost: no figure, no zero
    assert samples[("tunehub_gpu_held", "0")] == 0  # nobody holds them


# A trial holding the GPU until the test says go (a file). With USE_GPU it shows up on the GPU
# as a process using it would: it writes the stand-in's figures with its own pid (the test has
# the GPU busy from the start, before the trial's process could say its pid).
TRIAL = """
import os, pathlib, time, tuner
record = pathlib.Path(os.environ["RECORD_DIR"])
if os.environ.get("USE_GPU") == "1":
    figures = pathlib.Path(os.environ["NVML_STANDIN_FIGURES"])
    tmp = figures.with_suffix(".trial")
    tmp.write_text(f"gpu util=90 mem_used={2 * 2**30} mem_total={16 * 2**30} pids={os.getpid()}\\n")
    tmp.replace(figures)
(record / "pid").write_text(str(os.getpid()))
while not (record / "go").exists():
    time.sleep(0.05)  # the trial's own wait for the test's signal
print("cuda:", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
tuner.report(1.0)
"""


@pytest.fixture
def gpu_home(standin: StandIn, tmp_path: Path) -> Home:
    standin.set(idle_gpu())
    return Home(tmp_path / "home", f"sqlite:///{tmp_path / 'tunehub.sqlite'}", extra_env={
        "TUNEHUB_LOCAL_GPUS": "0", "TUNEHUB_WARM_START": "0",
        "TUNEHUB_GPU_SAMPLE_SECONDS": "0.3", "TUNEHUB_GPU_IDLE_GRACE_SECONDS": "1.5",
        **standin.env})


def _start(home: Home, tmp_path: Path, name: str) -> int:
    spec = write_sweep(tmp_path / name, TRIAL, name=name, trials=1, parallelism=1,
                       resources={"gpu": 1}, max_retries=0)
    return int(parse_json(home.cli("sweep", "run", str(spec), "--json", check=True).stdout)["id"])


def _show(home: Home, sweep: int) -> dict[str, Any]:
    return dict(parse_json(home.cli("sweep", "show", str(sweep), "--json", check=True).stdout))


def _use(home: Home, sweep: int) -> dict[str, Any]:
    """The sweep's one trial's measured GPU use so far ({} before there is any)."""
    trials = _show(home, sweep)["trials_detail"]
    return (trials[0]["gpu_use"] or {}) if trials else {}


def _use_when(home: Home, sweep: int, ready: Any, what: str) -> dict[str, Any]:
    """The trial's GPU use once ``ready(use)`` holds."""
    def check() -> dict[str, Any] | None:
        use = _use(home, sweep)
        return use if use and ready(use) else None
    return wait_for(check, timeout=180, what=what)


def _finish(home: Home, record: Path, sweep: int) -> dict[str, Any]:
    (record / "go").write_text("go")
    wait_for(lambda: _show(home, sweep)["state"] == "completed", timeout=180,
             what=f"sweep {sweep} to complete")
    return _show(home, sweep)


def test_a_trial_that_never_uses_its_gpu_is_flagged(gpu_home: Home, tmp_path: Path) -> None:
    home = gpu_home
    record = record_dir(home, tmp_path)
    sweep = _start(home, tmp_path, "cpu-bound")
    flagged = _use_when(home, sweep, lambda use: use["unused"],
                        "the idle trial to be flagged while it runs")
    assert flagged["holding"] and flagged["gpus"] == ["0"] and flagged["unused_gpus"] == ["0"]
    assert flagged["used_seconds"] == 0 and flagged["measured_seconds"] >= 1.5
    log = home.cli("sweep", "logs", str(sweep), "0", check=True).stdout
    assert "tunehub: GPU 0 of this attempt is not used: no process on it" in log

    done = _finish(home, record, sweep)
    use = done["trials_detail"][0]["gpu_use"]
    assert use["unused"] and not use["holding"] and use["attempt"] == 1
    assert use["allocated_seconds"] >= use["measured_seconds"] >= 1.5
    assert use["used_seconds"] == 0 and use["peak_memory_bytes"] == 0
    log = home.cli("sweep", "logs", str(sweep), "0", check=True).stdout
    assert "cuda: 0" in log and "and never used it" in log
    text = home.cli("sweep", "show", str(sweep), check=True).stdout
    assert "trial 0 held GPU 0 and did not use it" in text and "unused" in text

    usage = parse_json(home.cli("usage", "--since", "2026-01-01", "--json", check=True).stdout)
    assert usage["sweep"][str(sweep)] > 0 and usage["used"]["sweep"][str(sweep)] == 0
    assert usage["used_gpu_hours"] == 0


def test_a_trial_busy_on_its_gpu_is_counted_and_not_flagged(
    gpu_home: Home, standin: StandIn, tmp_path: Path
) -> None:
    home = gpu_home
    record = record_dir(home, tmp_path)
    home.extra_env["USE_GPU"] = "1"
    standin.set({"util": 90, "mem_used": 2 * GiB, "mem_total": 16 * GiB})
    sweep = _start(home, tmp_path, "gpu-bound")
    wait_for(lambda: (record / "pid").exists(), timeout=180, what="the trial to start")
    pid = int((record / "pid").read_text())
    # Measured for longer than the grace period, and in use all along.
    use = _use_when(home, sweep, lambda use: use["measured_seconds"] >= 3,
                    "a few seconds measured")
    assert not use["unused"] and use["used_seconds"] > 0
    assert use["peak_memory_bytes"] == 2 * GiB
    pool = parse_json(home.cli("pool", "--json", check=True).stdout)["gpus"][0]
    assert pool["holder"]["sweep_id"] == sweep and pool["pids"] == [pid]
    assert pool["utilization"] == 0.9 and pool["use"]["ever_busy"]

    # The GPU falls off the bus: the tuner says so, and goes on.
    standin.set({"error": GPU_IS_LOST})
    _use_when(home, sweep, lambda use: use["absent"] == LOST, "the lost GPU to be reported")

    done = _finish(home, record, sweep)
    use = done["trials_detail"][0]["gpu_use"]
    assert not use["unused"] and use["used_seconds"] > 0 and not use["holding"]
    # Utilisation-weighted: 90 % of the time it was measured with figures.
    assert use["used_seconds"] == pytest.approx(0.9 * use["measured_seconds"], rel=1e-6)
    log = home.cli("sweep", "logs", str(sweep), "0", check=True).stdout
    assert "not used" not in log and "never used" not in log
    usage = parse_json(home.cli("usage", "--since", "2026-01-01", "--json", check=True).stdout)
    assert 0 < usage["used"]["sweep"][str(sweep)] < usage["sweep"][str(sweep)]
    assert usage["used_gpu_hours"] == pytest.approx(use["used_seconds"] / 3600)


def test_in_use_means_a_process_on_it_or_utilisation_at_the_threshold() -> None:
    """The rule itself: a process on the GPU is use even at 0 %; utilisation under the
    threshold with nobody on it is not; no figures count as neither."""
    policy = UsePolicy(grace_seconds=10, busy_threshold=0.05)
    meter = UseMeter("0", since=100.0)
    meter.add(GpuReading("0", utilization=0.04, memory_used_bytes=0, memory_total_bytes=1),
              110.0, policy)
    assert meter.unused(policy) and meter.measured_seconds == 10 and meter.used_seconds == 0.4
    meter.add(GpuReading("0", absent=LOST), 200.0, policy)
    assert meter.measured_seconds == 10 and meter.absent == LOST and meter.unused(policy)
    meter.add(GpuReading("0", utilization=0.0, memory_used_bytes=5, memory_total_bytes=9,
                         pids=(1234,)), 205.0, policy)
    assert not meter.unused(policy) and meter.ever_busy and meter.busy_seconds == 5
    assert meter.peak_memory_bytes == 5 and meter.to_json(policy)["unused"] is False
    short = UseMeter("0", since=0.0)
    short.add(GpuReading("0", utilization=0.0, memory_used_bytes=0, memory_total_bytes=1),
              9.0, policy)
    assert not short.unused(policy)  # not yet measured for the grace period


NOTEBOOK_READ = ["custom:tuner:read", "access:services!service=tuner"]


def test_the_service_measures_what_notebooks_do_with_their_gpus(
    standin: StandIn, tmp_path: Path
) -> None:
    """A notebook server's GPU (held as the hub's spawner holds it) is measured by the tuner
    service: its used GPU-hours counted beside the allocated ones, while held and after."""
    from tests.test_gpu_pool_view import Holding

    standin.set({"util": 50, "mem_used": GiB, "mem_total": 16 * GiB, "pids": [4321]})
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}", extra_env={
            "TUNEHUB_LOCAL_GPUS": "0", "TUNEHUB_GPU_SAMPLE_SECONDS": "0.3", **standin.env}) as hub:
        ann = Holding({**os.environ, **hub.env}, person="ann", kind="notebook", server="")
        try:
            bob = hub.client(hub.token("bob", NOTEBOOK_READ))

            def usage() -> dict[str, Any]:
                got = bob.get("usage", params={"since": "2026-01-01"})
                assert got.status_code == 200, got.text
                return dict(got.json())

            held = wait_for(lambda: usage()["used"]["notebook"].get("ann", 0) > 0 and usage(),
                            timeout=120, what="the notebook's GPU use to be measured")
            assert 0 < held["used"]["notebook"]["ann"] <= held["notebook"]["ann"]
            gpu = bob.get("pool").json()["gpus"][0]
            assert gpu["holder"]["person"] == "ann" and gpu["use"]["ever_busy"]
            assert gpu["utilization"] == 0.5 and gpu["pids"] == [4321]
            metrics = httpx.get(f"{hub.url}services/tuner/metrics", timeout=30,
                                headers={"Authorization": f"token {hub.admin_token}"}).text
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(metrics) for s in f.samples}
            assert samples[("tunehub_gpu_used_seconds_total",
                            (("kind", "notebook"), ("person", "ann")))] > 0
            assert samples[("tunehub_gpu_utilization_ratio", (("gpu", "0"),))] == 0.5
            ann.release()  # the ledger keeps what was measured
            ended = usage()
            assert ended["used"]["notebook"]["ann"] >= held["used"]["notebook"]["ann"]
        finally:
            ann.stop()

"""Trial checkpoints: a retried attempt resumes from what the attempt before it saved.

The SDK's save and restore (atomic, no link followed, a no-op outside a sweep), then a real sweep
through the CLI: real trial processes with real TensorFlow (a tiny Keras model on synthetic
data) that die (``os._exit``) in their third epoch on attempt 1 and are retried
(``max_retries: 1``). The one that checkpoints resumes at epoch 3 with the weights it had; the
one that does not restarts at epoch 0. Both end with every epoch's value once.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import optuna
import pytest

from tests.conftest import Home
from tests.sweeps_helpers import parse_json, record_dir, write_sweep
from tuner.sdk import checkpoints
from tuner.sdk.training import ENV_CHECKPOINT_DIR

# --- the SDK ----------------------------------------------------------------------------------


@pytest.fixture
def ckpt_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "checkpoints"
    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(path))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return path


def test_checkpoint_then_restore_gives_back_the_latest(ckpt_dir: Path) -> None:
    assert checkpoints.restore() is None and checkpoints.resume_step() == 0
    checkpoints.checkpoint({"w": [1.0, 2.0]}, step=1)
    checkpoints.checkpoint({"w": [3.0], "nested": {"a": b"x"}}, step=2)
    assert checkpoints.restore() == ({"w": [3.0], "nested": {"a": b"x"}}, 2)
    assert checkpoints.resume_step() == 2
    assert sorted(os.listdir(ckpt_dir)) == [checkpoints.CHECKPOINT_FILE]  # no temp file left


def test_an_interrupted_save_keeps_the_previous_checkpoint(ckpt_dir: Path) -> None:
    checkpoints.checkpoint({"epoch": 1}, step=1)

    class Unpicklable:
        def __reduce__(self) -> tuple[object, ...]:
            raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError, match="killed mid-save"):
        checkpoints.checkpoint({"epoch": Unpicklable()}, step=2)
    # A save cut after its temp file was written (SIGKILL before the rename) leaves that file:
    (ckpt_dir / ".checkpoint.1.dead.tmp").write_bytes(b"half a pick")
    assert checkpoints.restore() == ({"epoch": 1}, 1)
    checkpoints.checkpoint({"epoch": 3}, step=3)  # and the next save clears it
    assert sorted(os.listdir(ckpt_dir)) == [checkpoints.CHECKPOINT_FILE]


def test_no_link_is_followed(ckpt_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.pkl"
    elsewhere.write_bytes(pickle.dumps({"format": 1, "step": 9}) + pickle.dumps({"x": 1}))
    ckpt_dir.mkdir()
    (ckpt_dir / checkpoints.CHECKPOINT_FILE).symlink_to(elsewhere)
    with pytest.raises(OSError):
        checkpoints.restore()  # a link is refused, not read through
    checkpoints.checkpoint({"mine": True}, step=1)  # the rename replaces the link itself
    assert not (ckpt_dir / checkpoints.CHECKPOINT_FILE).is_symlink()
    assert pickle.loads(elsewhere.read_bytes()) == {"format": 1, "step": 9}  # untouched
    assert checkpoints.restore() == ({"mine": True}, 1)
    # The directory itself a link: refused both ways.
    target = tmp_path / "target"
    target.mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(target)
    os.environ[ENV_CHECKPOINT_DIR] = str(linked)
    with pytest.raises(OSError):
        checkpoints.checkpoint({"x": 1}, step=1)
    with pytest.raises(OSError):
        checkpoints.restore()
    assert os.listdir(target) == []


def test_outside_a_sweep_nothing_is_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CHECKPOINT_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    checkpoints.checkpoint({"x": 1}, step=1)
    assert checkpoints.restore() is None and checkpoints.resume_step() == 0
    assert os.listdir(tmp_path) == []


def test_only_the_chief_of_a_multi_worker_trial_saves(ckpt_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}))
    checkpoints.checkpoint({"x": 1}, step=1)
    assert not ckpt_dir.exists()


# --- a real sweep -----------------------------------------------------------------------------

# Dies in its third epoch (before that epoch's end, so before its report) on attempt 1. Records,
# per attempt, each epoch begun with the weights' sum at that moment, and each epoch reported.
TRAIN = """
import json, os, sys
from pathlib import Path

import numpy as np
import keras
import tuner

p = tuner.params({"checkpoints": 1})
attempt = int(os.environ["TUNEHUB_TRIAL_ATTEMPT"])
record = Path(os.environ["RECORD_DIR"]) / f"trial{os.environ['TUNEHUB_TRIAL_NUMBER']}.jsonl"

def note(**what):
    with record.open("a") as fh:
        fh.write(json.dumps({"attempt": attempt, **what}) + "\\n")

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
keras.utils.set_random_seed(attempt)  # a restart from scratch would start elsewhere
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
note(initial_epoch=tuner.keras.initial_epoch())

class Probe(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        total = float(sum(float(np.sum(w)) for w in self.model.get_weights()))
        note(begin=epoch, weights=total)
        if attempt == 1 and epoch == 2:
            os._exit(3)

    def on_epoch_end(self, epoch, logs=None):
        note(reported=epoch + 1, value=float(logs["accuracy"]))

every = 1 if p["checkpoints"] else None
model.fit(x, y, epochs=5, batch_size=32, verbose=0,
          callbacks=[tuner.keras.ReportCallback("accuracy", checkpoint_every=every), Probe()])
"""


def _records(record: Path, number: int) -> list[dict[str, object]]:
    path = record / f"trial{number}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_retried_keras_trial_resumes_from_its_checkpoint(sqlite_home: Home,
                                                            tmp_path: Path) -> None:
    record = record_dir(sqlite_home, tmp_path)
    spec = write_sweep(
        tmp_path / "code", TRAIN, trials=2, parallelism=2, max_retries=1, sampler="grid",
        metric="accuracy", space={"checkpoints": {"type": "categorical", "choices": [1, 0]}},
    )
    proc = sqlite_home.cli("sweep", "run", str(spec), "--wait", "--json", timeout=300)
    out = parse_json(proc.stdout)
    assert out["state"] == "completed", (out, proc.stderr)
    trials = {t["params"]["checkpoints"]: t for t in out["trials_detail"]}
    study = optuna.load_study(study_name=optuna.get_all_study_names(sqlite_home.db_url)[0],
                              storage=sqlite_home.db_url)
    optuna_steps = {t.params["checkpoints"]: sorted(t.intermediate_values)
                    for t in study.trials}

    for checkpointed, trial in trials.items():
        assert trial["state"] == "completed" and trial["attempts"] == 2, trial
        # Every epoch's value once, in tunehub and in Optuna.
        assert [r["step"] for r in trial["intermediate_values"]] == [1, 2, 3, 4, 5], trial
        assert optuna_steps[checkpointed] == [1, 2, 3, 4, 5]
        rows = _records(record, trial["number"])
        first = [r for r in rows if r["attempt"] == 1]
        second = [r for r in rows if r["attempt"] == 2]
        assert [r["begin"] for r in first if "begin" in r] == [0, 1, 2]  # died in epoch 3
        assert [r["reported"] for r in first if "reported" in r] == [1, 2]
        if checkpointed:
            # Attempt 2 starts at epoch 3 with the weights attempt 1 had there, and reports
            # only the epochs attempt 1 did not.
            assert second[0] == {"attempt": 2, "initial_epoch": 2}
            assert [r["begin"] for r in second if "begin" in r] == [2, 3, 4]
            assert [r["reported"] for r in second if "reported" in r] == [3, 4, 5]
            died_at = next(r for r in first if r.get("begin") == 2)
            resumed_at = next(r for r in second if r.get("begin") == 2)
            assert resumed_at["weights"] == pytest.approx(died_at["weights"], rel=1e-6)
            reported = {r["reported"]: r["value"] for r in rows if "reported" in r}
            assert {r["step"]: r["value"] for r in trial["intermediate_values"]} == \
                pytest.approx(reported)
            assert trial["value"] == pytest.approx(reported[5])
        else:
            # Never checkpointed: attempt 2 restarts cleanly from epoch 0, nothing restored.
            assert second[0] == {"attempt": 2, "initial_epoch": 0}
            assert [r["begin"] for r in second if "begin" in r] == [0, 1, 2, 3, 4]
            assert [r["reported"] for r in second if "reported" in r] == [1, 2, 3, 4, 5]
        trial_dir = sqlite_home.path / "sweeps" / str(out["id"]) / "trials" / str(trial["number"])
        assert os.listdir(trial_dir / "checkpoints") == (
            [checkpoints.CHECKPOINT_FILE] if checkpointed else [])


# --- the Keras callback in-process ------------------------------------------------------------


def test_the_keras_callback_restores_weights_optimizer_and_epoch(
        ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import keras
    import numpy as np

    import tuner.sdk.keras as tk

    reports: list[tuple[float, int | None, bool]] = []
    monkeypatch.setattr(tk, "report", lambda v, step=None, last=False: reports.append(
        (v, step, last)))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")

    def model() -> keras.Model:
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        m.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        return m

    begun: list[int] = []
    probe = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: begun.append(epoch))
    first = model()
    first.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[tk.ReportCallback("accuracy")])
    assert [step for _, step, _ in reports] == [1, 2] and tk.initial_epoch() == 2

    second = model()  # another attempt: fresh weights, fresh optimizer
    callback = tk.ReportCallback("accuracy")
    assert tk.initial_epoch() == 2

    class Check(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            if epoch == 2:
                for a, b in zip(first.get_weights(), second.get_weights(), strict=True):
                    np.testing.assert_allclose(a, b)
                assert int(second.optimizer.iterations.numpy()) == 8  # 2 epochs × 4 batches

    second.fit(x, y, epochs=4, batch_size=16, verbose=0, callbacks=[callback, Check(), probe])
    assert begun == [2, 3] and callback.resumed_at == 2
    assert [(step, last) for _, step, last in reports[2:]] == [(3, False), (4, True)]
    assert second._initial_epoch is None  # a later fit of the model starts as asked

    # An attempt that finds the whole fit done (the last one died after its final epoch):
    # nothing trains again, and the saved last value is reported as the trial's result.
    reports.clear()
    begun.clear()
    third = model()
    third.fit(x, y, epochs=4, batch_size=16, verbose=0,
              callbacks=[tk.ReportCallback("accuracy"), probe])
    assert begun == [] and [(step, last) for _, step, last in reports] == [(4, True)]


# --- the directory, as both backends lay it out -----------------------------------------------


def test_each_trial_has_one_checkpoint_directory_for_all_its_attempts(tmp_path: Path) -> None:
    """The controller's layout (the local backend runs it as is) and the Kubernetes backend's
    hand-over: ``<trial>/checkpoints`` beside ``artifacts``, in the directory a trial pod mounts,
    shared with the trial group like ``artifacts``, and named in every attempt's env."""
    import stat

    from tuner.backends.kubernetes.workdir import CHECKPOINTS_MODE, hand_to_trial
    from tuner.lifecycle.trial_paths import TrialPaths
    from tuner.scheduling.trial_env import AttemptIdentity, trial_env
    from tuner.scheduling.workdirs import prepare_workdir

    paths = TrialPaths.new(tmp_path / "sweeps" / "7", 3)
    prepare_workdir(paths, None)
    assert paths.checkpoint_dir == paths.workdir / "checkpoints"
    assert paths.checkpoint_dir.parent == paths.artifact_dir.parent
    assert paths.checkpoint_dir.is_dir()
    (paths.checkpoint_dir / checkpoints.CHECKPOINT_FILE).write_bytes(b"kept")
    prepare_workdir(paths, None)  # the next attempt's: what is there stays
    assert (paths.checkpoint_dir / checkpoints.CHECKPOINT_FILE).read_bytes() == b"kept"

    hand_to_trial(tmp_path, paths.workdir, paths.log_path, os.getgid())
    assert stat.S_IMODE(paths.checkpoint_dir.stat().st_mode) == CHECKPOINTS_MODE

    envs = [trial_env({}, AttemptIdentity(7, 11, 3, attempt, "t", "http://x"), {},
                      paths.artifact_dir, tmp_path / "data", paths.checkpoint_dir)
            for attempt in (1, 2)]
    assert {env[ENV_CHECKPOINT_DIR] for env in envs} == {str(paths.checkpoint_dir)}


@pytest.mark.skipif(os.geteuid() != 0, reason="hands files to another uid: needs root")
def test_one_machine_hands_the_checkpoints_to_the_owner_and_never_seals_them(
        tmp_path: Path) -> None:
    """Trials as their owner's Unix user: ``checkpoints/`` is the owner's at each attempt (a link
    planted there is dropped, as in ``artifacts``), and the end of an attempt seals only the
    artifacts, so the next attempt can replace the checkpoint."""
    from tunehub_base.unix_users import UnixUser
    from tuner.backends.local import ownership
    from tuner.lifecycle.trial_paths import TrialPaths
    from tuner.scheduling.workdirs import prepare_workdir

    paths = TrialPaths.new(tmp_path / "sweeps" / "7", 0)
    prepare_workdir(paths, None)
    (paths.checkpoint_dir / "planted").symlink_to("/etc/shadow")
    (paths.checkpoint_dir / checkpoints.CHECKPOINT_FILE).write_bytes(b"saved")
    user = UnixUser("a", "a", 54321, 54321, tmp_path)
    ownership.hand_over(paths.workdir, paths.log_path, paths.artifact_dir, user,
                        paths.checkpoint_dir)
    ownership.seal(paths.artifact_dir)
    for path in (paths.checkpoint_dir, paths.checkpoint_dir / checkpoints.CHECKPOINT_FILE):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (54321, 54321), path
    assert os.listdir(paths.checkpoint_dir) == [checkpoints.CHECKPOINT_FILE]
    assert paths.artifact_dir.stat().st_uid == 0

"""Trials as local processes: the embedded default.

Each attempt runs in its own working directory with its own log file, in its own process group
(so a timeout or cancel kills everything it started), and dies with the controller
(``PR_SET_PDEATHSIG``) so a killed controller never leaves trials reporting into the void.

When the tuner runs as root with ``TUNEHUB_UNIX_USERS=1`` (``tunehub up`` as root), every attempt
runs as its owner's system user (:mod:`tuner.unix_users`) with an environment reduced to what a
person may see; the files it touches are laid out by :mod:`tuner.backends.ownership`. An owner
without an active system user gets a failed attempt with the reason, never a root process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from tuner import metrics, unix_users
from tuner.backends import ownership
from tuner.backends._base import (
    COLD,
    Backend,
    Ignore,
    TrialEvent,
    TrialLaunch,
    inherited_environment,
)
from tuner.backends.gpus import GpuPool, discover_gpus
from tuner.backends.local_processes import (
    Attempt,
    collect_worker_logs,
    command_argv,
    describe_exit,
    killpg,
    write_pid,
)
from tuner.backends.multiworker import SIBLING_GRACE_SECONDS, free_ports, tf_config, worker_log
from tuner.backends.parent_death import die_with_parent as _die_with_parent
from tuner.backends.warm import preload_for, warm_argv
from tuner.backends.zygote import Zygote
from tuner.spec import Resources, SpecError, SweepSpec
from tuner.states import CANCELLED_REASON, EventKind
from tuner.trial import ENV_ARTIFACT_DIR
from tuner.workdirs import HEADER

KILL_GRACE_SECONDS = 5.0
PRELOAD_CACHE = 64  # sweeps × commands whose preload list is remembered


class LocalBackend(Backend):
    """Runs attempts as processes of this machine.

    ``python script.py`` / ``python -m module`` trials start warm by default: forked from a
    process that already imported TensorFlow (see :mod:`tuner.backends.zygote_process`). Set
    ``TUNEHUB_WARM_START=0`` for a cold process per trial.
    """

    name = "local"

    def __init__(
        self, gpu_lock_dir: Path, gpu_ids: list[str] | None = None, warm: bool | None = None
    ) -> None:
        super().__init__()
        if gpu_ids is None:
            gpu_ids, self.gpu_source = discover_gpus()
        else:
            self.gpu_source = f"{len(gpu_ids)} configured"
        self.gpus = GpuPool(gpu_lock_dir, gpu_ids)
        if warm is None:
            warm = os.environ.get("TUNEHUB_WARM_START", "1") not in ("0", "false", "no")
        self.warm = warm
        self._zygotes: dict[tuple[tuple[str, ...], str], Zygote] = {}
        self.unix: unix_users.UnixUsers | None = None
        if unix_users.enabled():
            from tuner.settings import load_settings

            self.unix = unix_users.UnixUsers.from_env(load_settings().home)
        self._attempts: dict[tuple[int, int], Attempt] = {}
        # (sweep, warm argv, spec's preload) -> modules its zygote preloads
        self._preloads: dict[tuple[int, tuple[str, ...], object], tuple[str, ...]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def check(self, spec: SweepSpec) -> None:
        res = spec.resources
        if res.gpu * res.workers > self.gpus.total:
            per = f" × {res.workers} workers" if res.workers > 1 else ""
            raise SpecError(
                "resources.gpu",
                f"{res.gpu} GPU(s){per} per trial requested but this machine offers "
                f"{self.gpus.total} ({self.gpu_source}); trials are not run on the CPU "
                "instead. Set gpu: 0 to train on the CPU.",
            )
        if res.gpu_type is not None:
            raise SpecError(
                "resources.gpu_type",
                "the local backend cannot choose GPU types; remove it or use the "
                "kubernetes backend",
            )

    def can_launch(self, resources: Resources) -> bool:
        gpus = self.gpus.acquire(resources.gpu * resources.workers)
        if gpus is None:
            return False
        self.gpus.release(gpus)
        return True

    def snapshot_code(self, source: Path | None, target: Path, ignore: Ignore,
                      files: dict[str, bytes], owner: str) -> None:
        if self.unix is None:
            super().snapshot_code(source, target, ignore, files, owner)
            return
        try:
            user = self.unix.require(owner)
        except unix_users.UnixUserError as exc:
            raise SpecError("owner", str(exc)) from None
        ownership.snapshot_as(user, source, target, ignore, files)

    async def launch(self, launch: TrialLaunch) -> None:
        owner: unix_users.UnixUser | None = None
        if self.unix is not None:
            try:
                owner = self.unix.require(launch.owner)
                ownership.hand_over(launch.workdir, launch.log_path, self._artifacts(launch),
                                    owner)
            except (unix_users.UnixUserError, OSError) as exc:
                await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED,
                                           reason=f"cannot run as its owner: {exc}"))
                return
        workers, per_worker = launch.resources.workers, launch.resources.gpu
        gpus = self.gpus.acquire(per_worker * workers)
        if gpus is None:
            await self.emit(
                TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED, reason="no free GPU")
            )
            return
        # A person's trial sees none of the platform's environment (hub token, database URL).
        env = owner.environment(os.environ) if owner is not None else inherited_environment()
        env.update(launch.env)
        # The interpreter that runs tunehub runs trials too, with its packages (tuner, TF).
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONUNBUFFERED"] = "1"
        launch.workdir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = command_argv(launch.command)
        warm = warm_argv(argv, sys.executable) if self.warm else None
        preload = self._preload(launch, warm, owner) if warm is not None else ()
        start = self._start_note(launch, warm, preload)
        with open(launch.log_path, "a") as fh:
            fh.write(f"{HEADER} {start} ===\n")
        metrics.TRIAL_STARTS.labels("warm" if warm is not None else "cold").inc()
        hosts = [f"127.0.0.1:{p}" for p in free_ports(workers)] if workers > 1 else []
        procs: list[tuple[int, asyncio.Future[int]]] = []
        try:
            for index in range(workers):
                wenv = dict(env)
                # "" hides every GPU from CPU trials
                wenv["CUDA_VISIBLE_DEVICES"] = ",".join(
                    gpus[index * per_worker:(index + 1) * per_worker])
                log = launch.log_path
                if hosts:
                    wenv["TF_CONFIG"] = tf_config(hosts, index)
                    log = log if index == 0 else worker_log(launch.workdir, launch.attempt, index)
                if warm is not None:
                    procs.append(await self._start_warm(launch, warm, preload, wenv, log,
                                                        index, owner))
                else:
                    procs.append(await self._start_cold(launch, argv, wenv, log, owner))
        except OSError as exc:
            for pid, _ in procs:
                killpg(pid, signal.SIGKILL)
            self.gpus.release(gpus)
            await self.emit(
                TrialEvent(
                    launch.trial_id, launch.attempt, EventKind.FAILED,
                    reason=f"could not start {launch.command!r}: {exc.strerror or exc}",
                )
            )
            return
        write_pid(launch.workdir / f"attempt-{launch.attempt}.pid", [pid for pid, _ in procs])
        attempt = Attempt(launch, procs, gpus, owner)
        self._attempts[launch.key] = attempt
        await self.emit(
            TrialEvent(launch.trial_id, launch.attempt, EventKind.STARTED, reason=start))
        task = asyncio.get_running_loop().create_task(self._wait(attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _preload(
        self, launch: TrialLaunch, warm: list[str], owner: unix_users.UnixUser | None
    ) -> tuple[str, ...]:
        """What a warm trial's zygote preloads, worked out once per sweep and command: it
        follows the import graph of the sweep's code snapshot, which does not change while
        the sweep runs (every trial's directory links to the same files), and parsing it
        again for each of thousands of short trials cost milliseconds of every launch. Only
        the owner's files are read (a link they planted to a file of root's is skipped)."""
        key = (launch.sweep_id, tuple(warm), launch.preload)
        preload = self._preloads.get(key)
        if preload is None:
            preload = preload_for(launch.workdir, warm, launch.preload,
                                  owner.uid if owner is not None else None)
            if len(self._preloads) >= PRELOAD_CACHE:
                self._preloads.pop(next(iter(self._preloads)))
            self._preloads[key] = preload
        return preload

    def _start_note(
        self, launch: TrialLaunch, warm: list[str] | None, preload: tuple[str, ...]
    ) -> str:
        """What the trial's log and ``sweep show`` say about how it started: a cold start
        costs seconds per trial (TensorFlow's import), so the user is told why."""
        if warm is not None:
            return "warm start (forked from a process that imported " + ", ".join(
                preload) + ")"
        if not self.warm:
            return f"{COLD} (warm starts are off: TUNEHUB_WARM_START=0)"
        return (
            f"{COLD} (the command {launch.command!r} is not 'python script.py' or "
            "'python -m module', so it cannot be forked from a warm process)"
        )

    @staticmethod
    def _artifacts(launch: TrialLaunch) -> Path:
        return Path(launch.env.get(ENV_ARTIFACT_DIR) or launch.workdir / "artifacts")

    async def _start_cold(
        self, launch: TrialLaunch, argv: list[str], env: dict[str, str], log_path: Path,
        owner: unix_users.UnixUser | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        preexec = _die_with_parent
        if owner is not None:
            drop = unix_users.privilege_dropper(owner)

            def preexec() -> None:
                drop()
                _die_with_parent()  # after setuid: a changed identity clears the death signal

        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                         0o644)
        with open(log_fd, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=launch.workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        done = asyncio.ensure_future(proc.wait())
        return proc.pid, done

    async def _start_warm(
        self, launch: TrialLaunch, argv: list[str], preload: tuple[str, ...],
        env: dict[str, str], log_path: Path, index: int = 0,
        owner: unix_users.UnixUser | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        # One warm process per owner: it runs as them, so what it forks (and whatever earlier
        # requests left in its memory) is theirs alone.
        zkey = (preload, owner.login if owner is not None else "")
        zygote = self._zygotes.get(zkey)
        if zygote is None or not zygote.alive:
            zygote = Zygote(preload, owner)
            await zygote.start()
            self._zygotes[zkey] = zygote
        key = f"{launch.trial_id}-{launch.attempt}-{index}"
        return await zygote.spawn(key, argv, launch.workdir, env, log_path)

    async def _wait(self, attempt: Attempt) -> None:
        launch = attempt.launch
        try:
            code, reason = await asyncio.wait_for(
                asyncio.shield(self._outcome(attempt)), timeout=launch.timeout)
        except asyncio.TimeoutError:
            attempt.stop_reason = f"timed out after {launch.timeout:g}s (trial_timeout)"
            await self._kill(attempt)
            code, reason = await attempt.done, None
        if attempt.owner is not None:
            # What the registry may copy must not change under it, nor point outside.
            try:
                await asyncio.to_thread(ownership.seal, self._artifacts(launch))
            except OSError as exc:
                attempt.stop_reason = attempt.stop_reason or f"artifacts not sealed: {exc}"
        self.gpus.release(attempt.gpus)
        self._attempts.pop(launch.key, None)
        collect_worker_logs(attempt)
        if code == 0 and reason is None and attempt.stop_reason is None:
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.SUCCEEDED, 0))
        else:
            reason = attempt.stop_reason or reason or describe_exit(code)
            await self.emit(
                TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED, code, reason))

    async def _outcome(self, attempt: Attempt) -> tuple[int, str | None]:
        """The chief's exit code, and why the attempt failed although the chief did not.

        A worker that fails fails the attempt and the others are stopped (what the Indexed
        Job's ``backoffLimit: 0`` does on Kubernetes); once the chief exits 0 the others get
        :data:`SIBLING_GRACE_SECONDS` to finish on their own and are then stopped."""
        pending = {fut: index for index, (_, fut) in enumerate(attempt.procs)}
        while pending:
            finished, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in finished:
                index, code = pending.pop(fut), fut.result()
                if index == 0:
                    if code != 0:
                        await self._kill(attempt)
                        return code, None
                    try:
                        await asyncio.wait_for(
                            asyncio.gather(*(asyncio.shield(f) for f in pending)),
                            SIBLING_GRACE_SECONDS)
                    except asyncio.TimeoutError:
                        await self._kill(attempt)  # lingering: stopped, as a Job's pods are
                        return 0, None
                    failed = [(i, f.result()) for f, i in pending.items() if f.result() != 0]
                    if failed:
                        return failed[0][1], f"worker {failed[0][0]} {describe_exit(failed[0][1])}"
                    return 0, None
                if code != 0:
                    await self._kill(attempt)
                    return code, f"worker {index} {describe_exit(code)}; the others were stopped"
        return 0, None

    async def _kill(self, attempt: Attempt) -> None:
        """SIGTERM the attempt's process groups, SIGKILL after a grace period."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [(pid, fut) for pid, fut in attempt.procs if not fut.done()]
            if not alive:
                return
            for pid, _ in alive:
                killpg(pid, sig)
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(asyncio.shield(f) for _, f in alive)), KILL_GRACE_SECONDS)
                return
            except asyncio.TimeoutError:
                continue

    async def cancel(self, trial_id: int, attempt: int) -> None:
        running = self._attempts.get((trial_id, attempt))
        if running is not None:
            running.stop_reason = CANCELLED_REASON
            await self._kill(running)

    async def reconcile(self, sweep_id: int, running: list[TrialLaunch]) -> set[tuple[int, int]]:
        """Attempts of a dead controller died with it (PDEATHSIG); anything they started
        that is still around is killed so the retry never runs beside a leftover."""
        for launch in running:
            pid_file = launch.workdir / f"attempt-{launch.attempt}.pid"
            try:
                pgids = [int(line) for line in pid_file.read_text().split()]
            except (OSError, ValueError):
                continue
            for pgid in pgids:  # one per worker
                try:
                    # Only a process that is still this attempt (pids get reused).
                    marker = f"TUNEHUB_TRIAL_ID={launch.trial_id}\0".encode()
                    if marker in Path(f"/proc/{pgid}/environ").read_bytes():
                        os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
        return set()

    async def close(self) -> None:
        for attempt in list(self._attempts.values()):
            attempt.stop_reason = "controller stopped"
            await self._kill(attempt)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for zygote in self._zygotes.values():
            await zygote.close()
        self._zygotes.clear()


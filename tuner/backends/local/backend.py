"""Trials as local processes: the embedded default.

Each attempt runs in its own working directory with its own log file, in its own process group
(so a timeout or cancel kills everything it started), and dies with the controller
(``PR_SET_PDEATHSIG``) so a killed controller never leaves trials reporting into the void.

When the tuner runs as root with ``TUNEHUB_UNIX_USERS=1`` (``tunehub up`` as root), every attempt
runs as its owner's system user (:mod:`tunehub_base.unix_users`) with an environment reduced to what
a person may see; the files it touches are laid out by :mod:`tuner.backends.local.ownership`. An
owner without an active system user gets a failed attempt with the reason, never a root process.

Each attempt runs in a cgroup of its own (:mod:`tuner.backends.local.cgroups`): its memory, CPU and
processes bounded by the trial's ``resources``, and at its end everything in it is killed, so a
process that left the attempt's process groups (``setsid``, a double fork) dies with it too.
Where the machine offers no writable cgroup hierarchy (not root) the log says so once and the
process groups are all that is killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tunehub_base import unix_users
from tunehub_base.exit_status import describe_exit
from tunehub_base.gpu_holders import Holder
from tunehub_base.gpus import GpuPool, discover_gpus
from tunehub_base.options import setting
from tunehub_base.parent_process import die_with_parent
from tunehub_base.ports import unclaimed_ports
from tunehub_base.process_identity import parse_records
from tuner import metrics, untrusted_files
from tuner.backends._base import (
    COLD,
    Backend,
    Ignore,
    TrialEvent,
    TrialLaunch,
    inherited_environment,
)
from tuner.backends.local import island, ownership
from tuner.backends.local.cgroups import BoundedGroup, Hierarchy, bounds_for, open_hierarchy
from tuner.backends.local.gpu_watch import GpuWatch
from tuner.backends.local.island import Island, Islands
from tuner.backends.local.log_pipes import AttemptLog
from tuner.backends.local.multiworker import SIBLING_GRACE_SECONDS, tf_config
from tuner.backends.local.netns import enter_as_root
from tuner.backends.local.no_space import no_space_reason
from tuner.backends.local.preload_child import preload_in_child
from tuner.backends.local.processes import (
    Attempt,
    command_argv,
    killpg,
    still_running,
    write_pid,
)
from tuner.backends.local.warm import ALWAYS, warm_argv
from tuner.backends.local.zygote import Zygote, close_idle, imported_after_fork
from tuner.lifecycle.states import CANCELLED_REASON, PREEMPTED_REASON, EventKind
from tuner.scheduling.workdirs import HEADER
from tuner.sdk.training import (
    ENV_API_SOCKET,
    ENV_API_URL,
    ENV_ARTIFACT_DIR,
    ENV_CHECKPOINT_DIR,
)
from tuner.snapshot import CodeSource
from tuner.spec import Resources, SpecError, SweepSpec
from tuner.spec.values import memory_bytes

KILL_GRACE_SECONDS = 5.0
PRELOAD_CACHE = 64  # sweeps × commands whose preload list is remembered
PID_FILE_BYTES = 4096  # a pid file holds one pid per worker

log = logging.getLogger("tunehub.local")


def preempt_grace() -> float:
    """``TUNEHUB_PREEMPT_GRACE_SECONDS``: how long a preempted attempt has between SIGTERM and
    SIGKILL to save a checkpoint (``tuner.checkpoint`` in a SIGTERM handler, or the Keras
    callback). A value that is no number is said in the log and the default used: a typo in
    a setting must not stop the tuner from running sweeps."""
    grace = setting("TUNEHUB_PREEMPT_GRACE_SECONDS")
    try:
        return float(max(0, grace.number()))
    except ValueError as exc:
        log.error("%s; using %s", exc, grace.value)
        return float(grace.value or 0)


class LocalBackend(Backend):
    """Runs attempts as processes of this machine.

    ``python script.py`` / ``python -m module`` trials start warm by default: forked from a
    process that already imported TensorFlow (see :mod:`tuner.backends.local.zygote_process`). Set
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
        self.gpu_watch = GpuWatch(self.gpus)  # measured use of the attempts' GPUs
        if warm is None:
            warm = os.environ.get("TUNEHUB_WARM_START", "1") not in ("0", "false", "no")
        self.warm = warm
        self._zygotes: dict[tuple[tuple[str, ...], str], Zygote] = {}
        self._zygote_starts: dict[tuple[tuple[str, ...], str], asyncio.Lock] = {}
        self.unix: unix_users.UnixUsers | None = None
        if unix_users.enabled():
            from tunehub_base.settings import load_settings

            home = load_settings().home
            self.unix = unix_users.UnixUsers.from_env(home)
        # Each attempt its own network island, where people are apart (see island.py).
        self.islands = Islands(home) if self.unix is not None and island.enabled() else None
        self._attempts: dict[tuple[int, int], Attempt] = {}
        #: Attempts being stopped for the GPU pool: they end ``preempted``, not failed.
        self._preempted: set[tuple[int, int]] = set()
        self.preempt_grace = preempt_grace()
        #: GPUs promised to notebooks waiting in the pool's queue (the tuner service's
        #: :class:`~tuner.scheduling.gpu_queue.GpuQueue` sets it): a trial starts only on
        #: GPUs beyond these, so a GPU freed by a preemption goes to the notebook it was for.
        self.reserved: Callable[[], int] = lambda: 0
        #: The hub groups a trial's owner counts in (the GPU queue's, from the hub): written in
        #: the attempt's holder record, so its GPU-hours count for the owner's groups too.
        self.groups_of: Callable[[str], tuple[str, ...]] = lambda person: ()
        # (sweep, warm argv, spec's preload) -> modules its zygote preloads
        self._preloads: dict[tuple[int, tuple[str, ...], object],
                             asyncio.Future[tuple[str, ...]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Where attempts get their cgroups: made at the first launch (a backend that only
        # checks and snapshots a submission leaves nothing behind), False until then.
        self._cgroups: Hierarchy | None | Literal[False] = False

    @property
    def cgroups(self) -> Hierarchy | None:
        """The cgroup hierarchy of this backend's attempts; None where there is none, said
        once in the log."""
        if self._cgroups is False:
            self._cgroups, where = open_hierarchy()
            if self._cgroups is None:
                log.warning("local trials run without cgroups (%s): their memory, CPU and "
                            "processes are not bounded, and only their process groups are "
                            "killed at their end", where)
            else:
                log.info("each local attempt runs in a cgroup of its own, under %s", where)
        return self._cgroups

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
        need = resources.gpu * resources.workers
        # Probing for the reserved ones too: enough are free for the waiting notebooks and us.
        gpus = self.gpus.acquire(need + self.reserved() if need else 0)
        if gpus is None:
            return False
        self.gpus.release(gpus)
        return True

    def snapshot_code(self, source: CodeSource | Path | None, target: Path, ignore: Ignore,
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
                checkpoints = launch.env.get(ENV_CHECKPOINT_DIR)
                ownership.hand_over(launch.workdir, launch.log_path, self._artifacts(launch),
                                    owner, Path(checkpoints) if checkpoints else None)
            except (unix_users.UnixUserError, OSError) as exc:
                await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED,
                                           reason=f"cannot run as its owner: {exc}"))
                return
        workers, per_worker = launch.resources.workers, launch.resources.gpu
        gpus = self.gpus.acquire(per_worker * workers, Holder.trial_attempt(
            launch.owner, launch.sweep_id, launch.number, launch.attempt,
            self.groups_of(launch.owner)))
        if gpus is None:
            await self.emit(
                TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED, reason="no free GPU")
            )
            return
        try:
            group = self._group(launch)
        except (OSError, ValueError) as exc:  # ValueError: TUNEHUB_ATTEMPT_PIDS is no number
            self.gpus.release(gpus)
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED,
                                       reason=f"could not make its cgroup: {exc}"))
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
        preload = await self._preload(launch, warm, owner) if warm is not None else ()
        start = self._start_note(launch, warm, preload)
        try:
            output = AttemptLog(launch.log_path, f"{HEADER} {start} ===\n")
        except OSError as exc:
            if group is not None:
                await asyncio.to_thread(group.close)
            self.gpus.release(gpus)
            await self.emit(TrialEvent(
                launch.trial_id, launch.attempt, EventKind.FAILED,
                reason=f"cannot write its log {launch.log_path}: {exc.strerror or exc}"))
            return
        metrics.TRIAL_STARTS.labels("warm" if warm is not None else "cold").inc()
        hosts = [f"127.0.0.1:{p}" for p in unclaimed_ports(workers)] if workers > 1 else []
        # Made last before the workers start, so nothing between can leave it behind.
        isle: Island | None = None
        if self.islands is not None and owner is not None:
            try:
                isle = await self.islands.open(launch.trial_id, launch.attempt, owner,
                                               launch.env[ENV_API_URL])
            except OSError as exc:
                self.gpus.release(gpus)
                if group is not None:
                    await asyncio.to_thread(group.close)
                await self.emit(TrialEvent(
                    launch.trial_id, launch.attempt, EventKind.FAILED,
                    reason=f"could not make its network island: {exc}"))
                return
        if isle is not None:  # the tuner is reached through the island's socket
            env[ENV_API_SOCKET] = str(isle.report_socket)
        procs: list[tuple[int, asyncio.Future[int]]] = []
        try:
            for index in range(workers):
                wenv = dict(env)
                # "" hides every GPU from CPU trials
                wenv["CUDA_VISIBLE_DEVICES"] = ",".join(
                    gpus[index * per_worker:(index + 1) * per_worker])
                if hosts:
                    wenv["TF_CONFIG"] = tf_config(hosts, index)
                log = await output.pipe()
                if warm is not None:
                    procs.append(await self._start_warm(launch, warm, preload, wenv, log,
                                                        index, owner, group, isle))
                else:
                    procs.append(await self._start_cold(launch, argv, wenv, log, owner, group,
                                                        isle))
        except OSError as exc:
            for pid, _ in procs:
                killpg(pid, signal.SIGKILL)
            output.close()
            if group is not None:
                await asyncio.to_thread(group.close)
            self.gpus.release(gpus)
            if isle is not None:
                await asyncio.gather(*(fut for _, fut in procs), return_exceptions=True)
                await isle.close()
            await self.emit(
                TrialEvent(
                    launch.trial_id, launch.attempt, EventKind.FAILED,
                    reason=f"could not start {launch.command!r}: {exc.strerror or exc}",
                )
            )
            return
        output.started()
        write_pid(launch.workdir / f"attempt-{launch.attempt}.pid", [pid for pid, _ in procs])
        attempt = Attempt(launch, procs, gpus, output, owner, group, isle)
        self._attempts[launch.key] = attempt
        self.gpu_watch.start(launch.key, gpus, attempt.log.write)
        await self.emit(
            TrialEvent(launch.trial_id, launch.attempt, EventKind.STARTED, reason=start))
        task = asyncio.get_running_loop().create_task(self._wait(attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _group(self, launch: TrialLaunch) -> BoundedGroup | None:
        """The attempt's cgroup, bounded by its ``resources`` (None without cgroups)."""
        if self.cgroups is None:
            return None
        res = launch.resources
        bounds = bounds_for(memory_bytes(res.memory), res.cpu, res.workers)
        name = f"t{launch.trial_id}-a{launch.attempt}-{secrets.token_hex(3)}"
        return self.cgroups.create(name, bounds)

    async def _preload(
        self, launch: TrialLaunch, warm: list[str], owner: unix_users.UnixUser | None
    ) -> tuple[str, ...]:
        """What a warm trial's zygote preloads, worked out once per sweep and command: it
        follows the import graph of the sweep's code snapshot, which does not change while
        the sweep runs (every trial's directory links to the same files), and parsing it
        again for each of thousands of short trials cost milliseconds of every launch. Only
        the owner's files are read (a link they planted to a file of root's is skipped), and
        they are parsed in a bounded child process, never on this event loop
        (:mod:`tuner.backends.local.preload_child`); trials launched meanwhile wait on the
        same answer."""
        key = (launch.sweep_id, tuple(warm), launch.preload)
        pending = self._preloads.get(key)
        if pending is None:
            if len(self._preloads) >= PRELOAD_CACHE:
                self._preloads.pop(next(iter(self._preloads)))
            pending = asyncio.ensure_future(preload_in_child(
                launch.workdir, warm, launch.preload, owner.uid if owner is not None else None,
                fallback=ALWAYS))
            self._preloads[key] = pending
        return await asyncio.shield(pending)

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
        self, launch: TrialLaunch, argv: list[str], env: dict[str, str], output: int,
        owner: unix_users.UnixUser | None = None, group: BoundedGroup | None = None,
        isle: Island | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        drop = unix_users.privilege_dropper(owner) if owner is not None else None
        net_fd = isle.net_fd if isle is not None else None

        def preexec() -> None:
            if group is not None:
                group.place(0)  # as root, before the trial's command runs (OSError: no exec)
            if net_fd is not None:
                enter_as_root(net_fd)  # as root, before the person's identity
            if drop is not None:
                drop()
            die_with_parent(signal.SIGKILL)  # after setuid, which clears the death signal

        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=launch.workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except subprocess.SubprocessError as exc:  # preexec failed: nothing ran
            raise OSError(f"{exc} (placing it in its cgroup, or its user)") from None
        done = asyncio.ensure_future(proc.wait())
        return proc.pid, done

    async def _start_warm(
        self, launch: TrialLaunch, argv: list[str], preload: tuple[str, ...],
        env: dict[str, str], output: int, index: int = 0,
        owner: unix_users.UnixUser | None = None, group: BoundedGroup | None = None,
        isle: Island | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        # One warm process per owner: it runs as them, so what it forks (and whatever earlier
        # requests left in its memory) is theirs alone.
        zkey = (preload, owner.login if owner is not None else "")
        await close_idle(self._zygotes)
        # One start at a time per key: two sweeps of a person launching at once each started
        # a zygote, and the one replaced in the table, unreferenced, was collected and killed
        # with its trials (their parent-death signal).
        async with self._zygote_starts.setdefault(zkey, asyncio.Lock()):
            zygote = self._zygotes.get(zkey)
            if zygote is None or not zygote.alive:
                zygote = Zygote(preload, owner)
                await zygote.start()
                self._zygotes[zkey] = zygote
        key = f"{launch.trial_id}-{launch.attempt}-{index}"
        return await zygote.spawn(key, argv, launch.workdir, env, output,
                                  group.place if group is not None else None,
                                  (isle.ns_dir, isle.net_inode) if isle is not None else None)

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
        if attempt.group is not None:
            reason = await self._end_group(attempt, code, reason)
        self.gpu_watch.end(launch.key)
        self.gpus.release(attempt.gpus)
        self._attempts.pop(launch.key, None)
        if attempt.island is not None:
            await attempt.island.close()
        await attempt.log.finish()  # the whole output is in the log before anyone is told
        late = imported_after_fork(f for _, f in attempt.procs)
        if launch.key in self._preempted:
            self._preempted.discard(launch.key)
            how = (f"killed after its {self.preempt_grace:g}s grace period"
                   if code == -signal.SIGKILL else describe_exit(code))
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.PREEMPTED,
                                       code, f"{PREEMPTED_REASON} (its attempt {how})"))
        elif code == 0 and reason is None and attempt.stop_reason is None:
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.SUCCEEDED, 0,
                                       imported_after_start=late))
        else:
            reason = attempt.stop_reason or reason or describe_exit(code)
            if attempt.stop_reason is None:  # (its own failure: did the disk run out?)
                reason = no_space_reason(reason, attempt.log.chief_tail(),
                                         attempt.log.write_error(),
                                         self._artifacts(launch)) or reason
            await self.emit(TrialEvent(launch.trial_id, launch.attempt, EventKind.FAILED, code,
                                       reason, imported_after_start=late))

    async def _end_group(self, attempt: Attempt, code: int, reason: str | None) -> str | None:
        """Kill whatever is left in the attempt's cgroup (what it started and left behind:
        a ``setsid`` or double-forked process) and remove the group; a failed attempt whose
        group the kernel killed for memory says so in its reason."""
        group = attempt.group
        assert group is not None
        oom = await asyncio.to_thread(group.oom_killed)
        if not await asyncio.to_thread(group.close):
            log.error("attempt %s of trial %s: processes of its cgroup would not die",
                      attempt.launch.attempt, attempt.launch.trial_id)
        if oom and (code != 0 or reason is not None):
            res = attempt.launch.resources
            per = f" × {res.workers} workers" if res.workers > 1 else ""
            return (f"out of memory: the attempt went past its memory limit of "
                    f"{res.memory}{per} (resources.memory) and the kernel killed it")
        return reason

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

    async def _kill(self, attempt: Attempt, grace: float = KILL_GRACE_SECONDS) -> None:
        """SIGTERM the attempt's process groups, SIGKILL after ``grace`` seconds: to everything
        in its cgroup where it has one."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [(pid, fut) for pid, fut in attempt.procs if not fut.done()]
            if not alive:
                return
            if sig == signal.SIGKILL and attempt.group is not None:
                await asyncio.to_thread(attempt.group.kill)
            for pid, _ in alive:
                killpg(pid, sig)
            try:
                await asyncio.wait_for(asyncio.gather(*(asyncio.shield(f) for _, f in alive)),
                                       grace if sig == signal.SIGTERM else KILL_GRACE_SECONDS)
                return
            except asyncio.TimeoutError:
                continue

    async def cancel(self, trial_id: int, attempt: int) -> None:
        running = self._attempts.get((trial_id, attempt))
        if running is not None:
            running.stop_reason = CANCELLED_REASON
            await self._kill(running)

    async def preempt(self, trial_id: int, attempt: int) -> bool:
        """SIGTERM now, SIGKILL after :attr:`preempt_grace` (in a task: the caller, the pool's
        decision, does not wait for the trial to save its checkpoint); its end is reported
        ``preempted``, whatever its exit."""
        running = self._attempts.get((trial_id, attempt))
        if running is None or running.launch.key in self._preempted:
            return running is not None
        self._preempted.add(running.launch.key)
        running.stop_reason = PREEMPTED_REASON
        log.info("preempting attempt %s of trial %s: SIGTERM, SIGKILL after %gs", attempt,
                 trial_id, self.preempt_grace)
        task = asyncio.get_running_loop().create_task(self._kill(running, self.preempt_grace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def reconcile(self, sweep_id: int, running: list[TrialLaunch]) -> set[tuple[int, int]]:
        """Attempts of a dead controller died with it (PDEATHSIG); anything they started
        that is still around is killed so the retry never runs beside a leftover."""
        for launch in running:
            pid_file = launch.workdir / f"attempt-{launch.attempt}.pid"
            try:  # root's file, unless the attempt died before it was written: never followed
                text = untrusted_files.read_tail(pid_file, PID_FILE_BYTES)[0].decode()
                records = parse_records(text)
            except (OSError, ValueError):
                continue
            marker = f"TUNEHUB_TRIAL_ID={launch.trial_id}\0".encode()
            for record in records:  # one per worker; only a process still this attempt
                if still_running(record, marker):
                    killpg(record.pid, signal.SIGKILL)
        return set()

    async def close(self) -> None:
        for attempt in list(self._attempts.values()):
            attempt.stop_reason = "controller stopped"
            await self._kill(attempt)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.gpu_watch.close()
        for zygote in self._zygotes.values():
            await zygote.close()
        self._zygotes.clear()
        if self._cgroups:
            await asyncio.to_thread(self._cgroups.close)


"""The backend's side of warm starts: a zygote process (one per set of preloaded modules and
owner) that forks trials, and the JSON-lines pump that talks to it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import Counter

import tuner
from tunehub_base import unix_users
from tuner.backends._base import inherited_environment

log = logging.getLogger("tunehub.local.zygote")


NOT_FULLY_WARM = Counter(
    "tunehub_trial_not_fully_warm_total",
    "Warm-started local trial processes that still spent time importing installed packages "
    "themselves after their fork (a missed preload; the sweep's note names them)",
)
IMPORT_SECONDS = Counter(
    "tunehub_trial_import_after_start_seconds_total",
    "Seconds warm-started local trial processes spent importing installed packages "
    "themselves after their fork",
)

#: How a module name the zygote reports must look (it runs as the person: its words are
#: checked, not believed) and how many are kept.
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
MAX_IMPORTED = 20


class WarmExit(int):
    """A warm trial's exit code (negative for a signal, as asyncio's), and what it imported
    after its fork: the installed packages (top-level names) it spent time importing itself,
    in seconds (:mod:`tuner.backends.local.import_clock`); None when it could not say (killed,
    or it ended its own process)."""

    imported: dict[str, float] | None

    def __new__(cls, code: int, imported: object = None) -> WarmExit:
        self = super().__new__(cls, code)
        self.imported = _imported(imported)
        return self


def _imported(reported: object) -> dict[str, float] | None:
    if not isinstance(reported, dict):
        return None
    return {name: float(spent) for name, spent in list(reported.items())[:MAX_IMPORTED]
            if isinstance(name, str) and _MODULE_NAME.fullmatch(name)
            and isinstance(spent, int | float) and not isinstance(spent, bool)
            and 0 <= spent < 1e6}


def imported_after_fork(exits: Iterable[asyncio.Future[int]]) -> tuple[str, ...] | None:
    """What the processes of one attempt (their exit futures) imported after their fork
    (:class:`WarmExit`), most import time first: empty when they were fully warm, None when none
    could say (a cold start, or all were killed)."""
    counts: dict[str, float] = {}
    known = False
    for fut in exits:
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            continue
        code = fut.result()
        if isinstance(code, WarmExit) and code.imported is not None:
            known = True
            for name, n in code.imported.items():
                counts[name] = counts.get(name, 0) + n
    if not known:
        return None
    return tuple(sorted(counts, key=lambda name: (-counts[name], name)))


class Zygote:
    """A running zygote (:mod:`tuner.backends.local.zygote_process`) and its message pump."""

    def __init__(self, preload: tuple[str, ...],
                 owner: unix_users.UnixUser | None = None) -> None:
        self.preload = preload
        self.owner = owner  # run as this system user (from exec on), or as we run
        self.proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._spawned: dict[str, asyncio.Future[int]] = {}
        self._exited: dict[str, asyncio.Future[int]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._fd_channel: socket.socket | None = None  # carries each trial's output pipe
        self._last_used = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def idle_for(self) -> float | None:
        """Seconds since its last trial ended or was forked; None while a trial runs."""
        return None if self._exited else time.monotonic() - self._last_used

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        self._fd_channel, fds_theirs = socket.socketpair()
        env = self.owner.environment(os.environ) if self.owner else inherited_environment()
        env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
        # It speaks this backend's protocol: the same tuner package, wherever this one was
        # imported from (a person's reduced environment has no PYTHONPATH to find it by).
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(tuner.__file__).resolve().parent.parent),
             *filter(None, [env.get("PYTHONPATH")])])
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tuner.backends.local.zygote_process", str(theirs.fileno()),
            str(fds_theirs.fileno()), ",".join(self.preload),
            pass_fds=(theirs.fileno(), fds_theirs.fileno()),
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
            cwd="/" if self.owner else None,  # not the service's (private) directory
            preexec_fn=unix_users.privilege_dropper(self.owner) if self.owner else None,
        )
        theirs.close()
        fds_theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._ready = asyncio.get_running_loop().create_future()
        self._reader_task = asyncio.get_running_loop().create_task(self._pump(reader))
        await self._ready

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                msg: dict[str, Any] = json.loads(line)
                op, key = msg.get("op"), msg.get("id", "")
                if op == "ready" and self._ready and not self._ready.done():
                    self._ready.set_result(None)
                elif op == "spawned":
                    self._resolve(self._spawned.pop(key, None), msg["pid"])
                elif op == "exited":
                    self._last_used = time.monotonic()
                    ended = WarmExit(msg["code"], msg.get("imported"))
                    if ended.imported:
                        NOT_FULLY_WARM.inc()
                        IMPORT_SECONDS.inc(sum(ended.imported.values()))
                    self._resolve(self._exited.pop(key, None), ended)
                elif op == "error":
                    fut = self._spawned.pop(key, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(OSError(msg.get("error", "fork failed")))
        except (OSError, ValueError, KeyError, TypeError):
            log.exception("reading the warm-start process's messages failed; it is dropped")
            if self.proc is not None and self.proc.returncode is None:
                self.proc.kill()
        finally:
            # The zygote died: its children died with it (PDEATHSIG).
            orphans = len(self._exited)
            if self._ready and not self._ready.done():
                self._ready.set_exception(OSError("the warm-start process exited"))
            for fut in [*self._spawned.values()]:
                if not fut.done():
                    fut.set_exception(OSError("the warm-start process exited"))
            for fut in [*self._exited.values()]:
                self._resolve(fut, -9)
            self._spawned.clear()
            self._exited.clear()
            if orphans:
                log.error("the warm-start process %s (%s) ended with %d trial(s) running, "
                          "which died with it (reported as SIGKILL); it ended with %s",
                          self.proc.pid if self.proc else "?",
                          self.owner.login if self.owner else "the tuner's user",
                          orphans, await self._exit_status())

    async def _exit_status(self) -> str:
        """How the zygote ended, for the log (it may take a moment to be reaped)."""
        if self.proc is None:
            return "unknown"
        try:
            code = await asyncio.wait_for(self.proc.wait(), 5.0)
        except asyncio.TimeoutError:
            return "still running (its socket closed)"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    @staticmethod
    def _resolve(fut: asyncio.Future[int] | None, value: int) -> None:
        if fut is not None and not fut.done():
            fut.set_result(value)

    async def spawn(
        self, key: str, argv: list[str], cwd: Path, env: dict[str, str], output: int,
        place: Callable[[int], None] | None = None, island: tuple[str, int] | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        """Fork a trial whose stdout and stderr are ``output`` (the write end of the tuner's
        pipe, passed over the socket: the zygote, running as the trial's owner, never opens
        the log itself); returns its pid and a future of its exit code. The child waits
        until ``place(pid)`` (putting it in its attempt's cgroup) has returned; if that
        raises OSError the child exits without running anything and the error is raised.
        ``island``: the namespaces (``/proc/<pid>/ns``) the trial joins before it runs
        anything, and its network namespace's inode
        (:func:`tuner.backends.local.netns.enter_as_owner`)."""
        assert self._fd_channel is not None
        loop = asyncio.get_running_loop()
        spawned: asyncio.Future[int] = loop.create_future()
        exited: asyncio.Future[int] = loop.create_future()
        self._spawned[key], self._exited[key] = spawned, exited
        self._last_used = time.monotonic()
        # The descriptor first, then its request, with no await between: the zygote takes
        # one descriptor per spawn request, in order. A tiny message; the channel never fills.
        socket.send_fds(self._fd_channel, [b"\0"], [output])
        await self._send({"op": "spawn", "id": key, "argv": argv, "cwd": str(cwd), "env": env,
                          "island": island})
        pid = await spawned
        try:
            if place is not None:
                place(pid)
        except OSError:
            await self._send({"op": "abort", "id": key})
            raise
        await self._send({"op": "go", "id": key})
        return pid, exited

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.write(json.dumps(message).encode() + b"\n")
        await self._writer.drain()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._fd_channel is not None:
            self._fd_channel.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)


#: A warm process with no trial for this long is ended (the next trial of its set starts a new
#: one): every set of preloaded modules a person's sweeps ever used would otherwise keep a
#: process, TensorFlow's hundreds of MiB each, for as long as the tuner runs.
IDLE_SECONDS = 600.0


async def close_idle(zygotes: dict[Any, Zygote], seconds: float = IDLE_SECONDS) -> None:
    """End the zygotes of ``zygotes`` idle for ``seconds`` or more (or dead), and forget them."""
    for key, zygote in list(zygotes.items()):
        idle = zygote.idle_for
        if not zygote.alive or (idle is not None and idle >= seconds):
            del zygotes[key]  # before the await: nobody is handed it meanwhile
            await zygote.close()

"""The backend's side of warm starts: a zygote process (one per set of preloaded modules and
owner) that forks trials, and the JSON-lines pump that talks to it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tuner
from tunehub_base import unix_users
from tuner.backends._base import inherited_environment

log = logging.getLogger("tunehub.local.zygote")


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

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

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
                    self._resolve(self._exited.pop(key, None), msg["code"])
                elif op == "error":
                    fut = self._spawned.pop(key, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(OSError(msg.get("error", "fork failed")))
        except (OSError, ValueError, KeyError):
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

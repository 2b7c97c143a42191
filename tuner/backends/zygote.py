"""The backend's side of warm starts: a zygote process (one per set of preloaded modules and
owner) that forks trials, and the JSON-lines pump that talks to it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from tuner import unix_users
from tuner.backends._base import inherited_environment


class Zygote:
    """A running zygote (:mod:`tuner.backends.zygote_process`) and its message pump."""

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

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        env = self.owner.environment(os.environ) if self.owner else inherited_environment()
        env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tuner.backends.zygote_process", str(theirs.fileno()),
            ",".join(self.preload),
            pass_fds=(theirs.fileno(),),
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
            cwd="/" if self.owner else None,  # not the service's (private) directory
            preexec_fn=unix_users.privilege_dropper(self.owner) if self.owner else None,
        )
        theirs.close()
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
        finally:
            # The zygote died: its children died with it (PDEATHSIG).
            if self._ready and not self._ready.done():
                self._ready.set_exception(OSError("the warm-start process exited"))
            for fut in [*self._spawned.values()]:
                if not fut.done():
                    fut.set_exception(OSError("the warm-start process exited"))
            for fut in [*self._exited.values()]:
                self._resolve(fut, -9)
            self._spawned.clear()
            self._exited.clear()

    @staticmethod
    def _resolve(fut: asyncio.Future[int] | None, value: int) -> None:
        if fut is not None and not fut.done():
            fut.set_result(value)

    async def spawn(
        self, key: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path
    ) -> tuple[int, asyncio.Future[int]]:
        """Fork a trial; returns its pid and a future of its exit code."""
        assert self._writer is not None
        loop = asyncio.get_running_loop()
        spawned: asyncio.Future[int] = loop.create_future()
        exited: asyncio.Future[int] = loop.create_future()
        self._spawned[key], self._exited[key] = spawned, exited
        request = {"op": "spawn", "id": key, "argv": argv, "cwd": str(cwd), "env": env,
                   "log": str(log)}
        self._writer.write(json.dumps(request).encode() + b"\n")
        await self._writer.drain()
        return await spawned, exited

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

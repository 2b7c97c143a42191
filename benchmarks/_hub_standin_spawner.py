"""The spawner of ``benchmarks/hub_scale.py``'s hub: tunehub's local spawner in everything the
hub sees (profiles, per-person internal TLS certificates made by the hub at each spawn, the
server's API token and environment, polling, state) except the process it would start: the
person's server is a port opened by the stand-in process (``benchmarks/_hub_standin.py``),
asked over its Unix socket. Loaded by the hub from the benchmark's config file."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from traitlets import Integer, Unicode

from hub.local_spawner import TunehubLocalSpawner

#: What the stand-in needs of the server's environment (what jupyterhub-singleuser reads).
ENV_KEYS = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_ACTIVITY_URL",
            "JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_SSL_KEYFILE", "JUPYTERHUB_SSL_CERTFILE",
            "JUPYTERHUB_SSL_CLIENT_CA", "JUPYTERHUB_ACTIVITY_INTERVAL")
ASK_TIMEOUT = 60.0


class StandInSpawner(TunehubLocalSpawner):
    """A person's server is one listening port of the stand-in process."""

    standin_socket = Unicode(help="The stand-in process's control socket.").tag(config=True)

    standin_port = Integer(0, help="The running server's port (kept in the state).")

    async def _ask(self, **message: Any) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            reader, writer = await asyncio.open_unix_connection(self.standin_socket)
            try:
                writer.write(json.dumps(message).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
            answer: dict[str, Any] = json.loads(line or b"{}")
            if "error" in answer:
                raise RuntimeError(f"stand-in servers: {answer['error']}")
            return answer

        return await asyncio.wait_for(ask(), ASK_TIMEOUT)

    async def start(self) -> Any:
        self.chosen_profile()  # a wrong profile is refused as tunehub's spawner refuses it
        env = self.get_env()
        answer = await self._ask(op="start", name=self.user.name,
                                 env={k: env[k] for k in ENV_KEYS if env.get(k)})
        self.standin_port = int(answer["port"])
        return ("127.0.0.1", self.standin_port)

    async def poll(self) -> int | None:
        if not self.standin_port:
            return 0
        answer = await self._ask(op="poll", name=self.user.name)
        return None if answer.get("running") else 0

    async def stop(self, now: bool = False) -> None:
        await self._ask(op="stop", name=self.user.name)
        self.standin_port = 0

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.standin_port:
            state["standin_port"] = self.standin_port
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.standin_port = int(state.get("standin_port", 0))

    def clear_state(self) -> None:
        super().clear_state()
        self.standin_port = 0

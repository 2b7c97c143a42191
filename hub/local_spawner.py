"""Notebook servers as local processes on this machine (the embedded default).

Two ways, one class. With ``unix_users`` (``tunehub up`` as root sets it) each account has a system
user of its own (:mod:`tunehub_base.unix_users`, created with the account) and its server runs as
that user, as JupyterHub's ``LocalProcessSpawner`` does (initgroups, setgid, setuid in the child
before exec): people are separated by the operating system. Without it (the hub is not root), every
server runs as the user running the hub (``SimpleLocalProcessSpawner``), which is no boundary
between people: ``tunehub up`` says so at start-up. Either way each person has a home under
``$TUNEHUB_HOME/users/<name>`` with the shared data store linked in as ``~/data``; Kubernetes mode
gives each person a pod.

GPUs are whole devices taken from the same lock files the tuner's local backend uses, so a
notebook and a trial never share a GPU. The notebook server process itself holds the locks
(inherited file descriptors): they outlive a hub restart and free themselves when the server
exits, however it exits. CPU-only servers see no GPU at all (``CUDA_VISIBLE_DEVICES=""``).
A GPU notebook on a full pool waits in the tuner's queue (:mod:`hub.gpu_wait`), which
preempts a trial for it, with its position and reason on the spawn page, up to
``gpu_wait_timeout``; without a queue (``pool_queue_url`` empty) it is refused at once.

Why ours and not JupyterHub's ``LocalProcessSpawner``: it looks the hub user's name up as a
system user (``pwd.getpwnam(user.name)``) and switches to it; ours switches to the account's own
system user, whose login is not the account's name (``tunehub-NAME``, :mod:`tunehub_base.
unix_users`) and which the platform creates, and it must run as the hub user when the hub is not
root. It also hands the GPU locks to the server as inherited descriptors (``pass_fds``), links
the data store into a home under ``$TUNEHUB_HOME``, and refuses a server it cannot start with a
reason for the person (:class:`~hub.spawn_refused.SpawnRefused`). What it can share, it does:
it is a ``SimpleLocalProcessSpawner`` (JupyterHub's process handling, polling and stopping), and
it keeps the base class's pre-exec step (``chdir`` to the home) before its own privilege drop.
"""

from __future__ import annotations

import asyncio
import html
import math
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, default

from hub import internal_tls, network_fence, server_limits
from hub.gpu_wait import PoolQueueClient
from hub.spawn_refused import SpawnRefused
from tunehub_base import landlock, ports, unix_users
from tunehub_base.cgroups.base import BoundedGroup, Bounds
from tunehub_base.gpu_holders import Holder, HolderBook
from tunehub_base.gpus import GpuPool, discover_gpus
from tunehub_base.options import setting
from tunehub_base.unix_users import UnixUser, UnixUsers

ISLANDS = setting("TUNEHUB_NETWORK_ISLANDS")
SERVER_MEMORY = setting("TUNEHUB_SERVER_MEMORY")
SERVER_CPU = setting("TUNEHUB_SERVER_CPU")
SERVER_PIDS = setting("TUNEHUB_SERVER_PIDS")
#: The hub says once that abstract Unix sockets are not fenced on this kernel.
_SAID_NO_LANDLOCK = False


def default_profiles(gpu_count: int) -> list[dict[str, Any]]:
    """CPU only, plus one GPU and all GPUs when the machine has any."""
    profiles: list[dict[str, Any]] = [
        {"slug": "cpu", "display_name": "CPU only", "gpus": 0, "default": True}
    ]
    if gpu_count >= 1:
        profiles.append({"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1})
    if gpu_count >= 2:
        profiles.append(
            {"slug": f"gpu-{gpu_count}", "display_name": f"{gpu_count} GPUs", "gpus": gpu_count}
        )
    return profiles


class TunehubLocalSpawner(SimpleLocalProcessSpawner):
    """Local JupyterLab servers with per-user homes and whole-GPU profiles."""

    profiles = List(
        Dict(),
        help="""Server profiles offered on the spawn page: a list of dicts with ``slug``,
        ``display_name``, ``gpus`` (whole GPUs) and optionally ``default: True``. The chosen slug
        is stored as ``user_options["profile"]`` (as KubeSpawner does), which the idle culler
        reads to give GPU servers a shorter idle timeout. Defaults to CPU only plus GPU
        profiles for the GPUs found on this machine.""",
    ).tag(config=True)

    gpu_lock_dir = Unicode(
        help="Directory of the per-GPU lock files shared with the tuner's local backend "
        "(default: the tuner's settings).",
    ).tag(config=True)

    data_path = Unicode(
        help="The shared data store, linked into each home as ``~/data`` (default: "
        "``TUNEHUB_DATA``).",
    ).tag(config=True)

    unix_users = Bool(
        help="""Run each server as the account's own system user (``tunehub-<name>``, created
        on demand), as ``LocalProcessSpawner`` does. Needs the hub to run as root. Default:
        ``TUNEHUB_UNIX_USERS=1`` and root (``tunehub up`` sets it when started as root).""",
    ).tag(config=True)

    network_fence = Bool(
        help="""Fence each person's notebook processes on the machine's network
        (:mod:`hub.network_fence`): what they listen on takes new connections from that person
        and the platform (root) only, and each server's abstract Unix sockets are reached only
        from inside it (:mod:`tunehub_base.landlock`, where the kernel has Landlock ABI 6).
        Needs ``unix_users``; default: on with it, unless ``TUNEHUB_NETWORK_ISLANDS=0`` (which
        turns the trials' islands off too). Where the fence cannot be made, the server is
        refused with the reason.""",
    ).tag(config=True)

    server_limits = Bool(
        help="""Bound each server and all it starts (:mod:`hub.server_limits`, cgroups): its
        memory by ``mem_limit``, its CPU by ``cpu_limit`` (JupyterHub's own options, which
        ``group_overrides`` can set per hub group) and its processes and threads by
        ``pids_limit``. Needs ``unix_users``; default: on with it. Where the machine cannot
        bound a server, it is refused with the reason.""",
    ).tag(config=True)

    pids_limit = Int(
        help="""Processes and threads a server and all it starts may have at once (its
        group's ``pids.max``): a fork bomb in one notebook stops there, not at the machine's
        limit, which the hub and everyone else share. Default: ``TUNEHUB_SERVER_PIDS``.""",
    ).tag(config=True)

    tls_dir = Unicode(
        help="""With internal TLS: the root-owned directory servers' certificates are handed
        over in (:func:`hub.internal_tls.hand_over`), instead of JupyterHub's ``~/.jupyterhub``
        in a home its owner controls. Set by the hub config.""",
    ).tag(config=True)

    pool_queue_url = Unicode(
        help="""The tuner's queue for GPUs (``.../api/v1/pool/requests``; the hub config sets
        it). A GPU notebook on a full pool waits there with its position, and the tuner
        preempts a trial for it. Empty: no queue, a full pool refuses the spawn at once.""",
    ).tag(config=True)

    pool_queue_ca = Unicode(
        help="The CA the tuner's certificate is checked against on the way to "
        "``pool_queue_url`` (internal TLS on one machine); empty: the system's CAs.",
    ).tag(config=True)

    gpu_wait_timeout = Float(
        600.0,
        help="""Seconds a GPU notebook waits in the pool's queue for its GPUs before its spawn
        fails with the reason. The wait comes on top of ``start_timeout`` (the server's own
        start), which is stretched by this much for a GPU profile.""",
    ).tag(config=True)

    gpu_poll_interval = Float(
        1.0,
        help="Seconds between two looks at the GPU locks (and asks to the tuner's queue, which "
        "keep the notebook's place: one not asked for 30 s lapses) while a notebook waits.",
    ).tag(config=True)

    gpus = List(Unicode(), help="GPU ids held by the running server (kept in the state).")

    gpu_holdings = Dict(help="""GPU id -> the id of its recorded holding (kept in the state): what
        ends the server's holdings in the GPU-hours ledger when it stops
        (:mod:`tunehub_base.gpu_holders`).""")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: ``start_timeout`` as configured: the server's own start, without a GPU wait.
        self._server_start_timeout = self.start_timeout
        #: While the spawn waits for GPUs: what the spawn page says (position and reason);
        #: once it got them, the last word (a wait that failed is JupyterHub's to report).
        self._gpu_wait_message: str | None = None
        self._gpu_wait_ended: str | None = None
        self._withdrawal: asyncio.Future[None] | None = None
        #: The person's group of the network fence, for the server's pre-exec step.
        self._fence_procs: Path | None = None
        self._abstract_sockets_scope: Callable[[], None] | None = None
        #: The server's bounded group (:mod:`hub.server_limits`), for the pre-exec step.
        self._bounded_group: BoundedGroup | None = None

    @default("unix_users")
    def _default_unix_users(self) -> bool:
        return unix_users.enabled()

    @staticmethod
    def _system_users() -> UnixUsers:
        from tunehub_base.settings import load_settings

        return UnixUsers.from_env(load_settings().home)

    def system_user(self) -> UnixUser:
        """The account's system user (made now if the account predates isolation)."""
        try:
            return self._system_users().ensure(self.user.name)
        except unix_users.UnixUserError as exc:
            raise SpawnRefused(str(exc)) from None

    @default("home_dir_template")
    def _default_home_template(self) -> str:
        from tunehub_base.settings import load_settings

        return str(load_settings().home / "users" / "{username}")

    @default("network_fence")
    def _default_network_fence(self) -> bool:
        return self.unix_users and ISLANDS.on()

    @default("server_limits")
    def _default_server_limits(self) -> bool:
        return self.unix_users

    @default("pids_limit")
    def _default_pids_limit(self) -> int:
        return SERVER_PIDS.number()

    @default("mem_limit")
    def _default_mem_limit(self) -> str | None:
        return SERVER_MEMORY.read()  # parsed by the trait ("8G"); a bad one: see _bound

    @default("cpu_limit")
    def _default_cpu_limit(self) -> float | None:
        value = SERVER_CPU.read()
        try:
            return float(value) if value else None
        except ValueError:
            raise TraitError(f"{SERVER_CPU.env}: expected cores, got {value!r}") from None

    @default("gpu_lock_dir")
    def _default_gpu_lock_dir(self) -> str:
        from tunehub_base.settings import load_settings

        return str(load_settings().gpu_locks_dir)

    @default("data_path")
    def _default_data_path(self) -> str:
        from tunehub_base.settings import load_settings

        return str(load_settings().data)

    @default("profiles")
    def _default_profiles(self) -> list[dict[str, Any]]:
        return default_profiles(len(discover_gpus()[0]))

    # --- profile choice --------------------------------------------------------------------

    def _default_profile(self) -> dict[str, Any]:
        return next((p for p in self.profiles if p.get("default")), self.profiles[0])

    @default("options_form")
    def _default_options_form(self) -> str:
        if len(self.profiles) < 2:
            return ""
        default_slug = self._default_profile()["slug"]
        rows = []
        for p in self.profiles:
            slug = html.escape(str(p["slug"]))
            checked = " checked" if p["slug"] == default_slug else ""
            rows.append(
                f'<div class="form-check"><input class="form-check-input" type="radio" '
                f'name="profile" id="profile-{slug}" value="{slug}"{checked}>'
                f'<label class="form-check-label" for="profile-{slug}">'
                f'{html.escape(str(p["display_name"]))}</label></div>'
            )
        return "<p>Choose a server:</p>" + "".join(rows)

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        return {"profile": (formdata.get("profile") or [self._default_profile()["slug"]])[0]}

    def chosen_profile(self) -> dict[str, Any]:
        slug = (self.user_options or {}).get("profile")
        if slug is None:
            return self._default_profile()
        for p in self.profiles:
            if p["slug"] == slug:
                return p
        choices = ", ".join(str(p["slug"]) for p in self.profiles)
        raise SpawnRefused(f"profile {slug!r} does not exist; choose one of: {choices}")

    # --- internal TLS (see hub.internal_tls) ------------------------------------------------

    async def create_certs(self) -> dict[str, str]:
        return internal_tls.create_notebook_certs(
            self.internal_certs_location, self.user.name,
            self.internal_trust_bundles[internal_tls.NOTEBOOKS_CA])

    async def move_certs(self, paths: dict[str, str]) -> dict[str, str]:
        if not self.unix_users:
            return paths  # the server runs as the hub's user, who can read the store
        owner = self.system_user()
        return internal_tls.hand_over(paths, Path(self.tls_dir), owner.login, owner.uid)

    # --- process ---------------------------------------------------------------------------

    def _prepare_home(self) -> None:
        if self.unix_users:
            self._owner = self.system_user()
            self.home_dir = str(self._owner.home)
        home = Path(self.home_dir)
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        link = home / "data"
        if self.data_path and not link.exists() and not link.is_symlink():
            Path(self.data_path).mkdir(parents=True, exist_ok=True)
            link.symlink_to(self.data_path, target_is_directory=True)
            if self.unix_users:
                os.lchown(link, self._owner.uid, self._owner.gid)

    def make_preexec_fn(self, name: str) -> Any:
        """As the parent's, then (isolated) become the account's user: the server and all it
        starts (kernels, terminals) run with that user's rights only."""
        chdir_home = super().make_preexec_fn(name)
        if not self.unix_users:
            return chdir_home
        drop = unix_users.privilege_dropper(self._owner)
        fence, scope = self._fence_procs, self._abstract_sockets_scope
        bounded = self._bounded_group

        def preexec() -> None:
            if fence is not None:
                network_fence.enter(fence)  # as root, before anything of the person's runs
            if bounded is not None:
                bounded.place(0)
            if scope is not None:
                scope()  # as root too (no no_new_privs needed, so sudo still works)
            drop()
            chdir_home()

        return preexec

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        env = super().user_env(env)
        if self.unix_users:
            env.update(USER=self._owner.login, LOGNAME=self._owner.login)
        return env

    def run_pre_spawn_hook(self) -> Any:
        """Before JupyterHub starts the clock on :meth:`start`: a GPU profile may first wait
        in the pool's queue, so its ``start_timeout`` is the server's own plus
        ``gpu_wait_timeout`` (a bad profile is refused by :meth:`start`, with its reason)."""
        try:
            gpus = int(self.chosen_profile().get("gpus") or 0)
        except SpawnRefused:
            gpus = 0
        waits = gpus > 0 and bool(self.pool_queue_url)
        self.start_timeout = self._server_start_timeout + (
            math.ceil(self.gpu_wait_timeout) if waits else 0)
        return super().run_pre_spawn_hook()

    def _groups(self) -> tuple[str, ...]:
        return tuple(sorted(g.name for g in getattr(self.user, "groups", None) or ()))

    async def _take_gpus(self, count: int) -> tuple[list[str], list[int]]:
        ids, source = discover_gpus()
        if count > len(ids):
            raise SpawnRefused(
                f"this profile needs {count} GPU(s) but this machine has {len(ids)} ({source})"
            )
        pool = GpuPool(Path(self.gpu_lock_dir), ids)
        taken = self._try_take(pool, count)
        if taken is not None:
            return taken
        if not self.pool_queue_url:
            raise SpawnRefused(
                f"all GPUs are busy (trials or other notebooks hold them); {count} needed. "
                "Try again later or start a CPU-only server."
            )
        return await self._wait_for_gpus(pool, count)

    def _try_take(self, pool: GpuPool, count: int) -> tuple[list[str], list[int]] | None:
        holder = Holder.notebook(self.user.name, self.name or "", self._groups())
        taken = pool.acquire(count, holder)
        if taken is None:
            return None
        self.gpu_holdings = pool.holdings(taken)
        return taken, pool.detach(taken)

    async def _wait_for_gpus(self, pool: GpuPool, count: int) -> tuple[list[str], list[int]]:
        """Wait in the tuner's queue (which preempts a trial for us) until the GPUs are ours
        or ``gpu_wait_timeout`` ran out; the spawn page shows the position and the reason
        meanwhile (:meth:`progress`)."""
        client = PoolQueueClient(self.pool_queue_url, Path(self.gpu_lock_dir),
                                 self.pool_queue_ca or None)
        self._gpu_wait_ended = None
        person, server = self.user.name, self.name or ""
        deadline = time.monotonic() + self.gpu_wait_timeout
        began = time.monotonic()
        try:
            while True:
                waiting = await client.ask(person, server, list(self._groups()), count)
                self._gpu_wait_message = waiting.message
                taken = self._try_take(pool, count)
                if taken is not None:
                    self.log.info("server for %s: got %d GPU(s) after %.1fs in the queue",
                                  person, count, time.monotonic() - began)
                    self._gpu_wait_ended = "GPU taken: starting your server"
                    return taken
                if time.monotonic() >= deadline:
                    raise SpawnRefused(
                        f"no GPU became free for you within {self.gpu_wait_timeout:g} s "
                        f"(gpu_wait_timeout); last: {waiting.message}. Try again later or "
                        "start a CPU-only server.")
                await asyncio.sleep(self.gpu_poll_interval)  # the next look at the locks
        finally:
            self._gpu_wait_message = None
            # Not awaited: a start cancelled here (its timeout) must not lose the GPUs taken.
            self._withdrawal = asyncio.ensure_future(client.withdraw(person, server))

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """The spawn page's news: while the server waits for GPUs, its place in the queue and
        why (each change once); then that the GPUs are taken. JupyterHub ends this when the
        spawn ends."""
        shown: str | None = None
        while True:
            message = self._gpu_wait_message
            if message is not None and message != shown:
                shown = message
                yield {"progress": 10, "message": message}
            elif message is None and shown is not None:
                if self._gpu_wait_ended is not None:
                    yield {"progress": 50, "message": self._gpu_wait_ended}
                return
            await asyncio.sleep(0.5)  # the next look at the wait's state

    async def start(self) -> Any:
        profile = self.chosen_profile()
        self._prepare_home()
        self._fence_procs = await self._fence() if self.network_fence else None
        self._abstract_sockets_scope = self._abstract_scope() if self.network_fence else None
        self._bounded_group = await self._bound() if self.server_limits else None
        gpus, fds = await self._take_gpus(int(profile.get("gpus") or 0))
        self.environment = {**self.environment, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        self.popen_kwargs = {**self.popen_kwargs, "pass_fds": tuple(fds)}
        if self.port == 0:  # JupyterHub's own pick is bind(0)'s, racing every outgoing connection
            self.port = ports.unclaimed_port()
        try:
            result = await super().start()
        except (OSError, subprocess.SubprocessError) as exc:
            raise self._not_started(exc) from None
        finally:
            for fd in fds:
                os.close(fd)  # the server process holds the locks now
        self.gpus = gpus
        self.log.info("server for %s: profile %s, GPUs %s", self.user.name, profile["slug"],
                      gpus or "none")
        return result

    def _abstract_scope(self) -> Callable[[], None] | None:
        """The server's own Landlock domain for abstract Unix sockets; where the kernel has
        none (before Linux 6.12) the server still starts, and the hub says so once."""
        scope = landlock.abstract_socket_scoper()
        global _SAID_NO_LANDLOCK
        if scope is None and not _SAID_NO_LANDLOCK:
            _SAID_NO_LANDLOCK = True
            self.log.warning(
                "this kernel has no Landlock ABI 6 (Linux 6.12): a notebook's abstract Unix "
                "sockets can be reached by other people's notebooks (TCP and UDP are fenced)")
        return scope

    async def _fence(self) -> Path:
        """The person's group of the network fence, the fence's table rewritten for it."""
        uid, server = self._owner.uid, self.name or ""

        def admit() -> Path:
            return network_fence.NetworkFence.open().admit(uid, server)

        try:
            return await asyncio.to_thread(admit)
        except (network_fence.FenceUnavailable, OSError, subprocess.SubprocessError) as exc:
            raise SpawnRefused(
                "your server was not started: other people's processes could reach what it "
                f"listens on ({exc}). Please tell an administrator (TUNEHUB_NETWORK_ISLANDS=0 "
                "turns this protection off).", reason="error", status_code=503,
                log_message=f"no network fence for {self.user.name}'s server: {exc}",
            ) from None

    async def _bound(self) -> BoundedGroup:
        """The server's bounded group, made fresh with its limits."""
        uid, server = self._owner.uid, self.name or ""

        def make() -> BoundedGroup:
            return server_limits.ServerLimits.open().make(uid, server, bounds)

        try:
            bounds = Bounds(memory=self.mem_limit or None, cpu=self.cpu_limit or None,
                            pids=self.pids_limit)
            return await asyncio.to_thread(make)
        except (server_limits.LimitsUnavailable, OSError, TraitError, ValueError) as exc:
            raise SpawnRefused(
                "your server was not started: its memory, CPU and processes could not be "
                f"bounded ({exc}). Please tell an administrator.", reason="error",
                status_code=503,
                log_message=f"no bounded group for {self.user.name}'s server: {exc}",
            ) from None

    def _end_server_group(self) -> None:
        """Everything the server started (its double forks, ``nohup`` jobs) killed, its groups
        (the fence's, the limits') removed; what will not die is logged (and killed before
        the server's next start). Found by the person and the server's name, so a server
        started before a hub restart is ended too."""
        self._fence_procs = self._bounded_group = None
        owner = self._system_users().lookup(self.user.name)
        if owner is None:
            return
        server = self.name or ""
        if self.network_fence:
            try:
                group = network_fence.NetworkFence.open().server_group(owner.uid, server)
            except (network_fence.FenceUnavailable, OSError):
                pass  # no fence: its server was never placed in a group
            else:
                if not network_fence.end_group(group):
                    self.log.error("what %s's server started would not end: %s",
                                   self.user.name, group)
        if self.server_limits:
            try:
                limits = server_limits.ServerLimits.open()
            except (server_limits.LimitsUnavailable, OSError):
                return  # never bounded
            if not limits.end(owner.uid, server):
                self.log.error("what %s's server started would not end: %s",
                               self.user.name, limits.group(owner.uid, server).dirs)

    def _not_started(self, exc: OSError | subprocess.SubprocessError) -> SpawnRefused:
        """Why the server process could not even be started, for the person and the admin.

        Popen raises when the program cannot be run as the account's user (``Permission
        denied``: a directory above this Python is closed to them, e.g. ``/root`` whose
        passage entry was removed) or when becoming that user fails. JupyterHub answers
        either with a bare "500 Internal Server Error"; the person gets the reason instead,
        as a 503: the platform's set-up is at fault, not their request."""
        program = self.cmd[0] if self.cmd else "the server"
        if isinstance(exc, OSError):
            what = f"{exc.filename or program}: {exc.strerror or exc}"
            if self.unix_users and isinstance(exc, PermissionError):
                gid = self._system_users().group_id()
                what = unix_users.unreachable([Path(program)], gid) or what
        else:
            what = str(exc)
        who = f" as {self._owner.login}" if self.unix_users else ""
        return SpawnRefused(
            f"your server could not be started{who}: {what}. The platform's set-up is at "
            "fault, not your request; please tell an administrator.",
            reason="error", status_code=503,
            log_message=f"server for {self.user.name} not started{who}: {exc!r}",
        )

    def get_args(self) -> list[str]:
        args = super().get_args()
        if os.geteuid() == 0 and not self.unix_users:
            # A root hub without system users: the servers run as the hub's user anyway.
            args.append("--allow-root")
        return args

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.gpus:
            state["gpus"] = list(self.gpus)
        if self.gpu_holdings:
            state["gpu_holdings"] = dict(self.gpu_holdings)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.gpus = list(state.get("gpus", []))
        self.gpu_holdings = dict(state.get("gpu_holdings", {}))

    def _end_gpu_holdings(self) -> None:
        """The stopped server's GPU time into the ledger (a holding another holder has taken
        over since, after closing it as stale, is left alone)."""
        book = HolderBook(Path(self.gpu_lock_dir))
        for gpu, holding in self.gpu_holdings.items():
            try:
                book.released(str(gpu), str(holding))
            except OSError as exc:
                self.log.warning("GPU %s of %s: release not in the ledger: %s", gpu,
                                 self.user.name, exc)
        self.gpu_holdings = {}

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        if self.network_fence or self.server_limits:  # what it started ends too, off the loop
            await asyncio.to_thread(self._end_server_group)

    def clear_state(self) -> None:
        """The server is gone (stopped, died, or never started): so is all it started (a
        stopped server's group is gone already, :meth:`stop`; this ends the group of one found
        dead or never started)."""
        if self.network_fence or self.server_limits:
            self._end_server_group()
        if self.gpu_holdings:
            self._end_gpu_holdings()
        super().clear_state()
        self.gpus = []

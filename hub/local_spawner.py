"""Notebook servers as local processes on this machine (the embedded default).

Two ways, one class. With ``unix_users`` (``tunehub up`` as root sets it) each account has a
system user of its own (:mod:`tuner.unix_users`, created with the account) and its server runs as
that user, as JupyterHub's ``LocalProcessSpawner`` does (initgroups, setgid, setuid in the child
before exec): people are separated by the operating system. Without it (the hub is not root),
every server runs as the user running the hub (``SimpleLocalProcessSpawner``), which is no
boundary between people: ``tunehub up`` says so at start-up. Either way each person has a home
under ``$TUNEHUB_HOME/users/<name>`` with the shared data store linked in as ``~/data``;
Kubernetes mode gives each person a pod.

GPUs are whole devices taken from the same lock files the tuner's local backend uses, so a
notebook and a trial never share a GPU. The notebook server process itself holds the locks
(inherited file descriptors): they outlive a hub restart and free themselves when the server
exits, however it exits. CPU-only servers see no GPU at all (``CUDA_VISIBLE_DEVICES=""``).
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Dict, List, Unicode, default

from hub.spawn_refused import SpawnRefused
from tuner import unix_users
from tuner.backends.gpus import GpuPool, discover_gpus
from tuner.unix_users import UnixUser


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


class _HandoverPool(GpuPool):
    """A :class:`GpuPool` that hands held locks over to a child process."""

    def detach(self, gpus: list[str]) -> list[int]:
        """The lock descriptors of ``gpus``; the pool forgets them (the caller closes its
        copies once the child has inherited them, without unlocking)."""
        return [self._held.pop(gpu) for gpu in gpus]


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

    gpus = List(Unicode(), help="GPU ids held by the running server (kept in the state).")

    @default("unix_users")
    def _default_unix_users(self) -> bool:
        return unix_users.enabled()

    def system_user(self) -> UnixUser:
        """The account's system user (made now if the account predates isolation)."""
        from tuner.settings import load_settings

        users = unix_users.UnixUsers.from_env(load_settings().home)
        try:
            return users.ensure(self.user.name)
        except unix_users.UnixUserError as exc:
            raise SpawnRefused(str(exc)) from None

    @default("home_dir_template")
    def _default_home_template(self) -> str:
        from tuner.settings import load_settings

        return str(load_settings().home / "users" / "{username}")

    @default("gpu_lock_dir")
    def _default_gpu_lock_dir(self) -> str:
        from tuner.settings import load_settings

        return str(load_settings().gpu_locks_dir)

    @default("data_path")
    def _default_data_path(self) -> str:
        from tuner.settings import load_settings

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

        def preexec() -> None:
            drop()
            chdir_home()

        return preexec

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        env = super().user_env(env)
        if self.unix_users:
            env.update(USER=self._owner.login, LOGNAME=self._owner.login)
        return env

    def _take_gpus(self, count: int) -> tuple[list[str], list[int]]:
        ids, source = discover_gpus()
        if count > len(ids):
            raise SpawnRefused(
                f"this profile needs {count} GPU(s) but this machine has {len(ids)} ({source})"
            )
        pool = _HandoverPool(Path(self.gpu_lock_dir), ids)
        taken = pool.acquire(count)
        if taken is None:
            raise SpawnRefused(
                f"all GPUs are busy (trials or other notebooks hold them); {count} needed. "
                "Try again later or start a CPU-only server."
            )
        return taken, pool.detach(taken)

    async def start(self) -> Any:
        profile = self.chosen_profile()
        self._prepare_home()
        gpus, fds = self._take_gpus(int(profile.get("gpus") or 0))
        self.environment = {**self.environment, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        self.popen_kwargs = {**self.popen_kwargs, "pass_fds": tuple(fds)}
        try:
            result = await super().start()
        finally:
            for fd in fds:
                os.close(fd)  # the server process holds the locks now
        self.gpus = gpus
        self.log.info("server for %s: profile %s, GPUs %s", self.user.name, profile["slug"],
                      gpus or "none")
        return result

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
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.gpus = list(state.get("gpus", []))

    def clear_state(self) -> None:
        super().clear_state()
        self.gpus = []

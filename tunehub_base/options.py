"""The table of tunehub's settings: for each, its environment variable, the hub option that
reads it (``c.TunehubHub.<option>``, if any), its default and what it means.

One table, read three ways: the hub's options (:class:`hub.options.TunehubHub`) take their help
text and their plain defaults from it; ``tunehub up`` takes the public address's defaults from
it; and the README's settings table is generated from it (:func:`markdown_table`;
``tests/test_settings_table.py`` checks the README against it). Where a setting is read stays
with the part it configures (where state lives: :mod:`tunehub_base.settings`; Unix users:
:mod:`tunehub_base.unix_users`; GPUs: :mod:`tunehub_base.gpus`; the Kubernetes backend's
``TUNEHUB_K8S_*``: ``tuner/backends/kubernetes/settings.py``), under the name given here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    """One setting: ``env`` is read from the environment (empty counts as unset); ``value`` is
    the default a reader uses when it is unset (None: computed by the reader, as ``default``
    says)."""

    env: str
    help: str
    default: str  # as people read it (the README's "default" column)
    option: str | None = None  # the hub option reading it: c.TunehubHub.<option>
    value: str | int | None = None

    def read(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's value, None when unset or empty."""
        raw = (os.environ if environ is None else environ).get(self.env)
        return raw or None

    def text(self, environ: Mapping[str, str] | None = None) -> str:
        """The value, or the table's default."""
        raw = self.read(environ)
        if raw is not None:
            return raw
        assert isinstance(self.value, str), f"{self.env} has no plain default"
        return self.value

    def on(self, environ: Mapping[str, str] | None = None) -> bool:
        """A switch: on unless its value (or the table's default) is ``0``, ``false``, ``no``
        or ``off``."""
        return self.text(environ).lower() not in ("0", "false", "no", "off")

    def number(self, environ: Mapping[str, str] | None = None, fallback: int | None = None) -> int:
        """The value as a whole number, or the table's default (``fallback`` where the default
        is computed); a value that is not a number is a ValueError naming the variable."""
        raw = self.read(environ)
        if raw is None:
            default = self.value if fallback is None else fallback
            assert isinstance(default, int), f"{self.env} has no numeric default"
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{self.env}: expected a whole number, got {raw!r}") from None


SETTINGS: tuple[Setting, ...] = (
    Setting("TUNEHUB_HOME", "state directory: tuner database, sweeps (code snapshot, trial dirs, "
            "logs), hub state", "`~/.tunehub` (root: `/var/lib/tunehub`)"),
    Setting("TUNEHUB_DB_URL", "the tuner's SQLAlchemy URL (sweeps, trials, models, and the Optuna "
            "study)", "SQLite in the home"),
    Setting("TUNEHUB_DATA", "the data store, same path in notebooks and trials; sweeps' "
            "`code` comes from here, the examples are seeded into its `examples/`",
            "`$TUNEHUB_HOME/data`"),
    Setting("TUNEHUB_REGISTRY", "model registry root (TensorFlow Serving layout)",
            "`$TUNEHUB_DATA/models`"),
    Setting("TUNEHUB_SERVING_ROOT", "the registry root as TensorFlow Serving sees it (base paths "
            "in `models.config`), e.g. `/models` in `docker run -v $TUNEHUB_REGISTRY:/models`",
            "`TUNEHUB_REGISTRY`"),
    Setting("TUNEHUB_MODE", "where notebook servers run: `local` processes on this machine, or "
            "`kubernetes` pods (the chart sets it)", "`local`", "mode", "local"),
    Setting("TUNEHUB_IP", "address the public proxy listens on (`tunehub up --ip`; `0.0.0.0` for "
            "the network)", "`127.0.0.1`", "ip", "127.0.0.1"),
    Setting("TUNEHUB_PORT", "port of the public proxy: the URL people open (`tunehub up --port`)",
            "`8000`", "port", 8000),
    Setting("TUNEHUB_HUB_PORT", "port of the hub process behind the proxy, loopback only",
            "`8081` (`tunehub up`: a free port)", "hub_port", 8081),
    Setting("TUNEHUB_PROXY_API_PORT", "port of the proxy's REST API, loopback only",
            "the public port + 1 (`tunehub up`: a free port)", "proxy_api_port"),
    Setting("TUNEHUB_TUNER_PORT", "port of the tuner service, loopback only; reached through the "
            "proxy at `/services/tuner/`", "`8082` (`tunehub up`: a free port)", "tuner_port",
            8082),
    Setting("TUNEHUB_HUB_STATE", "directory of the hub's state: its database, cookie secret, "
            "accounts", "`$TUNEHUB_HOME/hub`", "state_dir"),
    Setting("TUNEHUB_HUB_DB_URL", "the hub's own database, separate from the tuner's "
            "(`TUNEHUB_DB_URL`)", "SQLite in the hub's state directory", "db_url"),
    Setting("TUNEHUB_CPU_IDLE_TIMEOUT", "seconds a CPU-only notebook server may idle before it is "
            "stopped; 0 disables the idle culler", "`7200`", "cpu_idle_timeout", 7200),
    Setting("TUNEHUB_GPU_IDLE_TIMEOUT", "seconds a notebook server holding GPUs may idle before "
            "it is stopped, so idle GPUs go back to the pool", "`1800`", "gpu_idle_timeout", 1800),
    Setting("TUNEHUB_CULL_EVERY", "seconds between idle checks; 0: half the shorter timeout",
            "`0`", "cull_every", 0),
    Setting("TUNEHUB_ACTIVITY_INTERVAL", "seconds between a notebook server's activity reports "
            "(and busy-kernel checks) to the hub: how stale the culler's view can be", "`120`",
            "activity_interval", 120),
    Setting("TUNEHUB_HIGH_PRIORITY_GROUP", "hub group whose members may submit sweeps with "
            "`priority: high` (tuner admins may too; anyone else gets 403 naming this rule)",
            "`tuner-priority`", "high_priority_group", "tuner-priority"),
    Setting("TUNEHUB_TUNER_COMMAND", "command that runs the tuner service, split like a shell "
            "line", "this Python with `-m tuner.keeper` (it runs `-m tuner.service` and starts it "
            "again at once if it dies)", "tuner_command"),
    Setting("TUNEHUB_LOCAL_GPUS", "GPU ids local trials may use (`0,1`; empty: none)",
            "NVML's count"),
    Setting("TUNEHUB_WARM_START", "`0`: a cold Python process per trial", "warm"),
    Setting("TUNEHUB_REPORT_BATCH_SECONDS", "seconds a trial of a sweep that never prunes "
            "(`pruner: none`, several metrics) may hold its intermediate values to send them "
            "together (fewer requests for the tuner; what a killed trial held is lost); `0`: "
            "each value sent at once. Sweeps that prune always send at once", "`1`", value="1"),
    Setting("TUNEHUB_PREEMPT_GRACE_SECONDS", "seconds a local trial preempted for a notebook "
            "(or a higher-priority trial) gets between SIGTERM and SIGKILL to save a checkpoint",
            "`30`", value=30),
    Setting("TUNEHUB_POOL_SHARES", "the GPU pool's weights and caps per person and per hub "
            "group: the JSON/YAML itself (`{\"people\": {\"ana\": {\"weight\": 2, "
            "\"max_gpus\": 1}}}`) or the path of a file holding it, read again when it "
            "changes (see \"The GPU pool's policy\")", "everyone weight 1, no cap"),
    Setting("TUNEHUB_GPU_SAMPLE_SECONDS", "seconds between two NVML readings of the GPUs local "
            "trial attempts hold (their measured use: utilisation, memory, processes)", "`10`",
            value="10"),
    Setting("TUNEHUB_GPU_IDLE_GRACE_SECONDS", "seconds an attempt may hold a GPU without using it "
            "(no process on it, utilisation under `TUNEHUB_GPU_BUSY_PERCENT`) before it is "
            "flagged as not using its GPU", "`120`", value="120"),
    Setting("TUNEHUB_GPU_BUSY_PERCENT", "utilisation (percent) from which a GPU counts as used "
            "even with no process of the holder's on it", "`5`", value="5"),
    Setting("TUNEHUB_GPU_RECLAIM_WARN_SECONDS", "seconds a notebook server's GPUs may stay "
            "unused (no process on them, utilisation under `TUNEHUB_GPU_BUSY_PERCENT`) before "
            "the person is warned inside JupyterLab; 0 turns reclaiming off", "`1800`",
            value="1800"),
    Setting("TUNEHUB_GPU_RECLAIM_AFTER_SECONDS", "seconds after that warning, GPUs still unused, "
            "before the server is stopped and its GPUs given back (never while a cell runs)",
            "`900`", value="900"),
    Setting("TUNEHUB_GPU_RECLAIM_EXEMPT", "people (`NAME`) and groups (`group:NAME`), comma "
            "separated, whose idle GPU servers are never reclaimed", "empty", value=""),
    Setting("TUNEHUB_UNIX_USERS", "`tunehub up`: `1` a system user per person (needs root), `0` "
            "everyone shares the hub's Unix account", "`1` as root, else `0`"),
    Setting("TUNEHUB_UNIX_USER_PREFIX", "login of account `NAME` is `<prefix>NAME`",
            "`tunehub-`"),
    Setting("TUNEHUB_UNIX_GROUP", "the shared group of people's Unix users (owns the data store)",
            "`tunehub`"),
    Setting("TUNEHUB_NETWORK_ISLANDS", "as root with per-person Unix users: `1` each local "
            "attempt gets a network namespace of its own and each person's notebook processes "
            "are fenced (nobody else reaches what they listen on; needs `nft` and a cgroup v2 "
            "hierarchy), `0` attempts and notebooks share the machine's network", "`1`",
            value="1"),
    Setting("TUNEHUB_ISLAND_EGRESS", "`1`: islands reach the machine's network through a veth "
            "pair and source NAT (needs `nft`, and turns on IPv4 forwarding; IPv6 too where the "
            "machine has an IPv6 default route); `0`: loopback only (`127.0.0.1` and `::1`)",
            "`1`", value="1"),
    Setting("TUNEHUB_ISLAND_NETWORK", "IPv4 range the islands' veth links are cut from (/30 each; "
            "pick one the machine does not route)", "`100.64.0.0/10`", value="100.64.0.0/10"),
    Setting("TUNEHUB_ISLAND_NETWORK6", "IPv6 range the islands' veth links are cut from (/64 "
            "each, masqueraded out; pick one the machine does not route)",
            "`fd74:6e68:7562::/48`", value="fd74:6e68:7562::/48"),
    Setting("TUNEHUB_LOG_MAX_BYTES", "the most of a trial's log the logs API and `sweep logs` "
            "return: its last bytes, after a line saying how much came before", "`16777216`",
            value=16 * 2**20),
    Setting("TUNEHUB_MODEL_MAX_BYTES", "the largest model (all its files together) the "
            "registry takes from a trial; a larger one is not registered and the sweep says why",
            "`8589934592`", value=8 * 2**30),
    Setting("TUNEHUB_API_MAX_BODY", "largest request body (bytes) any tunehub server reads "
            "(the tuner service, the CLI's report endpoint, `tunehub model serve`), declared or "
            "chunked; a larger one is a 413 naming `body` before any of it is parsed (a "
            "notebook function's pickle travels in a sweep's body, base64)",
            "`33554432` (32 MiB)", value=32 * 2**20),
    Setting("TUNEHUB_API_MAX_JSON_DEPTH", "deepest nesting of a JSON request body; deeper is a "
            "400 naming `body`", "`32`", value=32),
    Setting("TUNEHUB_API_MAX_JSON_ITEMS", "most JSON values (`,` `[` `{` counted before parsing) "
            "in a request body; more is a 400 naming `body`, so no body keeps the service's "
            "event loop parsing", "`100000`", value=100_000),
    Setting("TUNEHUB_SERVE_MAX_CLIENT_REQUESTS", "`tunehub model serve`: predictions one client "
            "address may have in flight at once; more are a 429 naming this", "`8`", value=8),
    Setting("TUNEHUB_METRICS_SCOPE", "the hub scope a token needs to read the tuner's "
            "`/metrics` (the same token the hub's own `/hub/metrics` takes)", "`read:metrics`",
            value="read:metrics"),
    Setting("TUNEHUB_PROXY_HEADER_TIMEOUT", "seconds the proxy waits for a request's complete "
            "headers (and between requests on a kept-alive connection) before closing it",
            "`30`", value=30),
    Setting("TUNEHUB_PROXY_MAX_BODY", "largest request body (bytes) the hub's proxy forwards "
            "(it buffers a body whole; notebook uploads pass here too), declared or chunked; a "
            "larger one is the same JSON 413 naming `body` as `TUNEHUB_API_MAX_BODY`'s",
            "`104857600` (100 MiB)", value=100 * 2**20),
    Setting("TUNEHUB_PROXY_BODY_TIMEOUT", "seconds the proxy waits for a request's complete "
            "body", "`300`", value=300),
    Setting("TUNEHUB_PROXY_MAX_CLIENT_CONNECTIONS", "open connections one client address may "
            "hold to the proxy; more are closed as they arrive", "`256`", value=256),
    Setting("TUNEHUB_PROXY_MAX_CONNECTIONS", "open client connections the proxy holds in all "
            "(each also needs one to a backend); 0: half the descriptors it may open, less a "
            "reserve", "`0`", value=0),
    Setting("TUNEHUB_LOG_REPEAT_SECONDS", "the hub and proxy log a repeated identical error "
            "once per this many seconds, then one line with how many were left out", "`60`",
            value=60),
    Setting("TUNEHUB_MAX_TRIALS", "most `trials` one sweep may ask for; more is a 400 naming "
            "`trials` at submission, on either backend", "`10000`", value=10000),
    Setting("TUNEHUB_MAX_PARALLELISM", "most `parallelism` one sweep may ask for; more is a 400 "
            "naming `parallelism` at submission, on either backend", "`256`", value=256),
    Setting("TUNEHUB_MAX_WORKERS_PER_PERSON", "worker processes (running attempts × "
            "`resources.workers`) one person's sweeps may run at once, all their sweeps "
            "together, on either backend: more wait (pending) until theirs end; a trial needing "
            "more on its own is a 400 naming `resources.workers`", "`32`", value=32),
    Setting("TUNEHUB_ATTEMPT_PIDS", "processes and threads each worker of a local attempt may "
            "have at once (its cgroup's `pids.max` is this × `resources.workers`)", "`4096`",
            value=4096),
    Setting("TUNEHUB_SERVER_MEMORY", "as root with per-person Unix users: the memory each "
            "notebook server and all it starts may use (JupyterHub's `mem_limit`, e.g. `8G`; "
            "past it the kernel kills within that server), unset for no limit", "no limit"),
    Setting("TUNEHUB_SERVER_CPU", "as root with per-person Unix users: the CPU cores each "
            "notebook server may use (JupyterHub's `cpu_limit`, e.g. `2.5`), unset for no limit",
            "no limit"),
    Setting("TUNEHUB_SERVER_PIDS", "as root with per-person Unix users: processes and threads "
            "each notebook server and all it starts may have at once (its cgroup's `pids.max`)",
            "`4096`", value=4096),
    Setting("TUNEHUB_USERS_DIR", "people's own areas of the data store (`users/<name>`, made by "
            "the platform for each account); the chart sets it from `data.usersSubPath`",
            "`$TUNEHUB_DATA/users`"),
    Setting("TUNEHUB_BACKENDS", "backends the tuner service runs trials on, comma-separated "
            "(`local`, `kubernetes`); the chart sets `kubernetes`", "`local`", value="local"),
    Setting("TUNEHUB_TRIAL_API_URL", "the tuner's address as trials reach it, when it differs "
            "from the one the hub gives the service (the chart: the tuner's Service)",
            "the service's own URL"),
    Setting("TUNEHUB_REPLICA_URL", "with several tuner replicas (the chart's `tuner.replicas`): "
            "this replica's own address, where the others send the reports of the trials it "
            "runs (the chart: the pod's IP)", "the service's own URL"),
    Setting("TUNEHUB_LOG_LEVEL", "the tuner service's log level (`DEBUG`, `INFO`, `WARNING`, …)",
            "`INFO`", value="INFO"),
    Setting("TUNEHUB_USER", "the single-user CLI on one machine (`tunehub sweep run` without "
            "the hub): the owner its sweeps are recorded under", "the Unix login"),
    Setting("TUNEHUB_HUB_VALUES", "Kubernetes mode: the chart's values file the hub reads (the "
            "chart mounts it from a Secret and sets this)", "`/usr/local/etc/tunehub/values.yaml`"),
    Setting("TUNEHUB_ADMIN_USER", "Kubernetes mode: an admin account the hub makes (or whose "
            "password it resets) at its start; the chart sets it from `auth.admin`'s Secret",
            "unset: no such account"),
    Setting("TUNEHUB_ADMIN_PASSWORD", "Kubernetes mode: that admin's password (from the same "
            "Secret); required with `TUNEHUB_ADMIN_USER`", "unset"),
    Setting("TUNEHUB_TUNER_API_TOKEN", "Kubernetes mode: the tuner service's hub token as the hub "
            "registers it (from the chart's Secret)", "required in Kubernetes mode"),
    Setting("TUNEHUB_K8S_*", "the Kubernetes backend (image, namespace, GPU types, Kueue queue, "
            "per-user caps, …): documented in `tuner/backends/kubernetes/settings.py`", ""),
)

#: What tunehub sets for the processes it starts (notebook servers and trials): their contract
#: with the SDK (``tuner.sdk``), not settings; a spec's ``env`` may set none of them.
PROVIDED: tuple[tuple[str, str], ...] = (
    ("TUNEHUB_API_URL", "notebooks and trials: the tuner's API base URL"),
    ("TUNEHUB_API_CA", "notebooks and trials: the internal CA that the tuner's TLS certificate "
     "is checked against (one machine)"),
    ("TUNEHUB_API_SOCKET", "trials in a network island: the Unix socket their reports go "
     "through"),
    ("TUNEHUB_TOKEN", "the notebook client's token, when not the server's own "
     "`JUPYTERHUB_API_TOKEN`"),
    ("TUNEHUB_SWEEP_ID", "trials: the sweep's id"),
    ("TUNEHUB_TRIAL_ID", "trials: the trial's id (its report route)"),
    ("TUNEHUB_TRIAL_NUMBER", "trials: the trial's number in its sweep"),
    ("TUNEHUB_TRIAL_ATTEMPT", "trials: which attempt of the trial this is"),
    ("TUNEHUB_TRIAL_TOKEN", "trials: the attempt's own report token"),
    ("TUNEHUB_PARAMS", "trials: the hyperparameters, as JSON (`tuner.params()`)"),
    ("TUNEHUB_ARTIFACT_DIR", "trials: where `tuner.save_model` exports"),
    ("TUNEHUB_CHECKPOINT_DIR", "trials: the trial's checkpoint directory, kept across its "
     "attempts (`tuner.checkpoint`, `tuner.restore`)"),
    ("TUNEHUB_BUSY_CHECK_SECONDS", "notebook servers: seconds between busy-kernel checks "
     "(from `TUNEHUB_ACTIVITY_INTERVAL`)"),
)

BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}
BY_OPTION: dict[str, Setting] = {s.option: s for s in SETTINGS if s.option is not None}


def setting(env: str) -> Setting:
    return BY_ENV[env]


def hub_state_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The hub's state directory: ``TUNEHUB_HUB_STATE``, else ``hub`` in the state home."""
    return Path(BY_ENV["TUNEHUB_HUB_STATE"].read(environ) or home / "hub")


def url_of(ip: str, port: int) -> str:
    """The URL people open for a public proxy listening on ``ip``:``port``."""
    host = "127.0.0.1" if ip in ("", "0.0.0.0", "::") else ip
    return f"http://{host}:{port}/"


def markdown_table() -> str:
    """The README's settings table."""
    lines = ["| variable | hub option | meaning | default |", "|---|---|---|---|"]
    for s in SETTINGS:
        option = f"`{s.option}`" if s.option else ""
        lines.append(f"| `{s.env}` | {option} | {s.help} | {s.default} |")
    return "\n".join(lines)


def provided_table() -> str:
    """The README's table of what tunehub sets for notebooks and trials."""
    lines = ["| variable | what it holds |", "|---|---|"]
    lines += [f"| `{env}` | {what} |" for env, what in PROVIDED]
    return "\n".join(lines)

"""The tuner service: REST API + sweep controllers, run as a JupyterHub service.

``python -m tuner.service``. It reads the variables JupyterHub gives its services
(``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``, ``JUPYTERHUB_API_TOKEN``,
``JUPYTERHUB_API_URL``, ...) and tunehub's settings. On start it takes over every active sweep
whose controller is gone, so sweeps outlive restarts of the service, the hub and notebooks.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import signal
import ssl
import time
from urllib.parse import urlparse

from sqlalchemy import select
from tornado.httpserver import HTTPServer
from tornado.web import Application

from tunehub_base import ports, tls
from tunehub_base.parent_process import die_with_parent, parent_runs
from tunehub_base.settings import Settings, load_settings
from tuner.api.app import make_app
from tuner.api.auth import make_hub_auth
from tuner.api.context import ServiceContext
from tuner.backends import make_backend
from tuner.db import Database, SweepRow
from tuner.db.outage import once_reachable, patient, waited, waiting_out_outages
from tuner.errors import Conflict
from tuner.lifecycle.liveness import HEARTBEAT_SECONDS, controller_alive
from tuner.lifecycle.states import SweepState
from tuner.scheduling.host import SweepHost
from tuner.scheduling.hub_groups import HubGroups
from tuner.search.study import storage_for
from tuner.sweep_store import SweepStore

log = logging.getLogger("tunehub.service")
#: Seconds the service keeps trying a taken port before it exits naming the holder.
BIND_PATIENCE = 10.0


def cookie_secret(settings: Settings) -> bytes:
    """Kept in the home so OAuth cookies survive a restart of the service."""
    path = settings.home / "tuner-cookie-secret"
    if not path.exists():
        path.write_bytes(secrets.token_bytes(32))
        path.chmod(0o600)
    return path.read_bytes()


@patient
def _unfinished_sweeps(engine: SweepHost) -> list[SweepRow]:
    with engine.db.session() as s:
        return list(
            s.scalars(
                select(SweepRow).where(
                    SweepRow.state.in_(SweepState.unfinished()),
                    SweepRow.backend.in_(list(engine.backends)),
                )
            )
        )


async def adopt_orphans(engine: SweepHost, claimed_only: bool = False) -> list[int]:
    """Run every active sweep of our backends whose controller died. A database outage
    meanwhile is waited out (the read in a worker thread, each claim again with backoff):
    the service that restarts after a crash is the one that resumes its sweeps.
    ``claimed_only``: only sweeps some controller had claimed (not one submitted a moment ago
    whose own controller, a CLI's, is about to claim it)."""
    with waiting_out_outages():
        sweeps = await asyncio.to_thread(_unfinished_sweeps, engine)
    adopted = []
    for sweep in sweeps:
        if sweep.id in engine.controllers or controller_alive(sweep):
            continue
        if claimed_only and sweep.controller_pid is None:
            continue
        try:
            await once_reachable(engine.run_sweep, sweep.id)
            adopted.append(sweep.id)
        except Conflict as exc:
            # Another replica took it first (several tuners on one database), or it ended.
            log.info("not resuming sweep %s: %s", sweep.id, exc)
    return adopted


async def keep_adopting(engine: SweepHost) -> None:
    """With several tuners on one database, a replica that dies leaves its sweeps to the
    others: each replica looks for sweeps whose controller is dead every heartbeat and claims
    them (the claim is one transaction that locks the sweep's row, so exactly one replica
    wins). The sweep's attempts are then reconciled as after a restart of the service."""
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)  # a period, not a wait for something
        try:
            adopted = await adopt_orphans(engine, claimed_only=True)
        except Exception:  # a fault of one pass (the database away) must not end the loop
            log.exception("looking for sweeps to take over failed; trying again")
            continue
        if adopted:
            log.warning("took over sweeps whose tuner stopped: %s", adopted)


def tls_context() -> ssl.SSLContext | None:
    """With the hub's internal TLS (it sets ``JUPYTERHUB_SSL_*`` for its services): serve with
    the certificate the hub made for this service. A client certificate is checked when one
    is presented (the proxy's, the hub's) and not required: notebooks and trials call the
    tuner directly and prove who they are with their token."""
    cert, key = os.environ.get("JUPYTERHUB_SSL_CERTFILE"), os.environ.get("JUPYTERHUB_SSL_KEYFILE")
    if not (cert and key):
        return None
    return tls.server_context(cert, key, os.environ.get("JUPYTERHUB_SSL_CLIENT_CA"),
                              require_client_cert=False)


async def listen(app: Application, host: str, port: int,
                 context: ssl.SSLContext | None) -> HTTPServer:
    """Listen, or exit non-zero naming who holds the port. The hub restarts a service that
    exits, so a port taken for a moment (our previous process still closing) is tried again
    for :data:`BIND_PATIENCE` seconds first; serving nothing while saying nothing is no option."""
    deadline = time.monotonic() + BIND_PATIENCE
    while True:
        try:
            # No xheaders: the client address is the connection's own, or what the hub proxy
            # says on its own connection (tunehub_base.request_bounds.client_address).
            return app.listen(port, host, ssl_options=context)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if time.monotonic() > deadline:
                message = ports.in_use_message("the tuner service", host, port)
                log.error("%s", message)
                raise SystemExit(message) from None
        await asyncio.sleep(1.0)  # the holder may be our previous process, still closing


async def serve() -> None:
    from tuner.serving.registry import Registry

    settings = load_settings().ensure_dirs()
    # Migrations can take a while on a big database: never on the event loop. A database
    # that is down (the machine rebooting, a failover) is waited for, said once in the log:
    # crashing instead would only have the hub start us again and again.
    db = await asyncio.to_thread(Database.when_reachable, settings.db_url)
    # Optuna's schema too, once, before the first submission (made by the first sweeps
    # submitted at once, it held their requests for seconds and raced between them).
    await asyncio.to_thread(waited, storage_for, settings.db_url)
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    host, port = url.hostname or "127.0.0.1", url.port or 10101
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/tuner/")
    own_url = f"{url.scheme or 'http'}://{host}:{port}{prefix}"
    trial_api = os.environ.get("TUNEHUB_TRIAL_API_URL") or own_url
    replica_url = os.environ.get("TUNEHUB_REPLICA_URL") or own_url
    names = [n.strip() for n in os.environ.get("TUNEHUB_BACKENDS", "local").split(",") if n]
    backends = {name: make_backend(name, settings) for name in names}
    registry = Registry(db, settings.registry, settings.serving_root)
    # TensorFlow Serving finds a current file from the start (from the database: waited for).
    await asyncio.to_thread(waited, registry.write_serving_config)
    engine = SweepHost(db, settings, backends, trial_api, registry, stable_api_url=True,
                       replica_url=replica_url)
    ctx = ServiceContext(
        engine=engine,
        store=SweepStore(db, settings),
        registry=registry,
        hub_auth=make_hub_auth(),
        backends=backends,
        default_backend=names[0],
    )
    notebook_gpus = None
    reading_groups: asyncio.Task[None] | None = None
    hub_groups = HubGroups.from_environment()  # None without a hub (nobody's groups known)
    if "local" in backends:
        from tuner.backends.local.backend import LocalBackend
        from tuner.metrics import watch_gpu_pool
        from tuner.notebook_gpu_watch import NotebookGpuWatch
        from tuner.queue_metrics import watch_gpu_queue
        from tuner.scheduling.gpu_queue import GpuQueue

        if names[0] != "kubernetes":  # the pool's metrics are the cluster's there
            watch_gpu_pool(settings.gpu_locks_dir)
        notebook_gpus = NotebookGpuWatch(settings.gpu_locks_dir)  # notebooks' measured GPU use
        local = backends["local"]
        if isinstance(local, LocalBackend):
            ctx.gpu_queue = GpuQueue(engine, local, settings.gpu_locks_dir,
                                     hub_groups=hub_groups)
            if names[0] != "kubernetes":
                ctx.pool_metrics = watch_gpu_queue(ctx.gpu_queue)
    if names[0] == "kubernetes":  # the pool people see is the cluster's
        from tuner.backends.kubernetes import KubernetesBackend
        from tuner.pool_sources.kubernetes import KubernetesPoolSource

        cluster = backends["kubernetes"]
        if isinstance(cluster, KubernetesBackend):
            from tuner.pool_sources.kube_metrics import watch_kube_pool

            source = ctx.pool_source = KubernetesPoolSource(
                cluster.settings, db, groups_of=hub_groups.of if hub_groups else lambda p: (),
                hub=hub_groups)
            engine.gpu_use_sink = source.use_writer.measured  # trial pods' readings, kept
            ctx.pool_metrics = watch_kube_pool(source)
    if hub_groups is not None:
        # Which hub groups people are in: a team's quota counts its trials (the local pool
        # reads the groups its shares name), a pod's GPU-hours count for its person's groups
        # (Kubernetes: every group).
        queue = ctx.gpu_queue
        configured = (None if names[0] == "kubernetes" or queue is None
                      else (lambda: queue.shares.groups.keys()))
        reading_groups = asyncio.get_running_loop().create_task(
            hub_groups.keep_reading(configured))
    app = make_app(engine, prefix, ctx, cookie_secret(settings))
    server = await listen(app, host, port, tls_context())
    await engine.start()
    if notebook_gpus is not None:
        notebook_gpus.start()
    if ctx.pool_source is not None:
        await ctx.pool_source.start()  # the cluster's GPU-hours, recorded as pods come and go
    adopted = await adopt_orphans(engine)
    log.info(
        "tuner service on %s://%s:%s%s (backends: %s; resumed sweeps: %s)",
        url.scheme, host, port, prefix, ", ".join(names), adopted or "none",
    )
    adopting = asyncio.get_running_loop().create_task(keep_adopting(engine))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: sweeps are left to resume on the next start")
    adopting.cancel()
    if reading_groups is not None:
        reading_groups.cancel()
    server.stop()
    if notebook_gpus is not None:
        await notebook_gpus.close()
    if ctx.pool_source is not None:
        await ctx.pool_source.close()
    await engine.close()
    db.dispose()


def main() -> None:
    if parent_runs(b"jupyterhub") or parent_runs(b"tuner.keeper"):
        # A managed service (one machine): a killed hub (or keeper, tuner.keeper) must not
        # leave us holding the port its successor starts us on (SIGTERM: we stop as on any
        # stop; sweeps resume).
        die_with_parent(signal.SIGTERM)
    logging.basicConfig(
        level=os.environ.get("TUNEHUB_LOG_LEVEL", "INFO"),
        format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s",
    )
    asyncio.run(serve())


if __name__ == "__main__":
    main()

"""tunehub's JupyterHub configuration, for both modes.

Only wiring lives here: every choice and its reason is in a module of ``hub/``. Settings come
from ``TUNEHUB_*`` environment variables (see ``hub/options.py``; ``tunehub up`` sets them) or
from ``c.TunehubHub.<option>`` in a config file loaded before this one.
"""

import logging
import sys
from pathlib import Path
from urllib.parse import quote

from hub import (
    culler,
    gpu_reclaim,
    hub_restart,
    internal_tls,
    local_spawner,
    notebook,
    scopes,
    tuner_service,
)
from hub.auth import TunehubAuthenticator
from hub.log_limits import limit_repeats
from hub.options import TunehubHub
from tunehub_base.accounts import AccountStore

c = get_config()  # noqa: F821 -- provided by JupyterHub when it loads this file

opts = TunehubHub(config=c)
if opts.mode == "kubernetes":
    from hub import kube, kube_logins  # the Kubernetes mode's own modules

    settings = opts.settings
    kube.prepare_data_dirs(settings, logging.getLogger("JupyterHub"))  # NFS: may not be ours
else:
    settings = opts.settings.ensure_dirs()
state = Path(opts.state_dir)
state.mkdir(parents=True, exist_ok=True, mode=0o700)

# --- platform traffic: TLS on one machine (hub/internal_tls.py); Kubernetes: see the chart ----
internal = None
if opts.mode == "local":
    internal = internal_tls.InternalTls(state / "internal-ssl", settings.home / "tls").prepare()
    internal.configure(c)
    c.TunehubLocalSpawner.tls_dir = str(internal.public)
scheme = "https" if internal else "http"

# --- the hub, its state, its pages ----------------------------------------------------------
c.JupyterHub.bind_url = f"http://{opts.ip}:{opts.port}/"
c.JupyterHub.hub_bind_url = f"{scheme}://127.0.0.1:{opts.hub_port}"
c.JupyterHub.db_url = opts.db_url
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.template_paths = [str(Path(local_spawner.__file__).parent / "templates")]
sweeps_url = tuner_service.sweeps_page_url()
c.JupyterHub.template_vars = {"tunehub_sweeps_url": sweeps_url, "tunehub_accounts": True}
# Idle GPU servers warned, then stopped with a reason the home page shows (hub/gpu_reclaim.py).
gpu_reclaim.configure(c, state)

# A repeated identical error (an EMFILE storm) is written once per interval, with a count.
limit_repeats("JupyterHub", "tornado", "asyncio")

# --- the proxy: configurable-http-proxy from PyPI (no Node.js), see hub/proxy.py ------------
c.ConfigurableHTTPProxy.command = [sys.executable, "-m", "hub.proxy"]
api_socket = state / "proxy-api.sock"
if internal and len(str(api_socket)) < internal_tls.MAX_SOCKET_PATH:
    c.ConfigurableHTTPProxy.api_url = f"http+unix://{quote(str(api_socket), safe='')}"
else:
    c.ConfigurableHTTPProxy.api_url = f"{scheme}://127.0.0.1:{opts.proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")

# --- logins ----------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = TunehubAuthenticator
c.TunehubAuthenticator.accounts_file = str(state / "accounts.json")
if opts.mode == "kubernetes":
    values = kube.KubeValues(config=c).load()
    # The chart's first admin (password from its Secret); other authenticators: hub.config.
    kube_logins.ensure_secret_admin(state / "accounts.json")
    c.JupyterHub.template_vars["tunehub_accounts"] = kube_logins.uses_local_accounts(values)

# --- who may use the tuner -------------------------------------------------------------------
admins = [a.name for a in AccountStore(state / "accounts.json").all() if a.admin]
if opts.mode == "kubernetes":
    # Another authenticator: its admins, not accounts left from earlier local logins.
    local = kube_logins.uses_local_accounts(values)
    admins = [*(admins if local else []), *kube_logins.configured_admins(values)]
scopes.configure(c, tuner_service.SERVICE_NAME, admins, opts.high_priority_group)
# The tuner reads hub groups' members: a team's GPU quota (one machine), GPU-hours per group.
c.JupyterHub.load_roles.append(scopes.tuner_service_role(tuner_service.SERVICE_NAME))

# --- notebook servers ------------------------------------------------------------------------
tuner_url = f"{scheme}://127.0.0.1:{opts.tuner_port}"
notebook.configure(
    c,
    # Straight to the tuner over verified TLS on one machine, not through the public port.
    api_url=(f"{tuner_url}{tuner_service.sweeps_page_url()}" if internal
             else f"{opts.public_url}services/{tuner_service.SERVICE_NAME}/"),
    data_path=str(settings.data),
    activity_interval=opts.activity_interval,
    api_ca=str(internal.api_ca) if internal else None,
)
if opts.mode == "kubernetes":
    kube.configure_kubespawner(c, values)
    profiles = kube.profiles_for_culler(c)
else:
    c.JupyterHub.spawner_class = local_spawner.TunehubLocalSpawner
    c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 120
    profiles = local_spawner.default_profiles(len(local_spawner.discover_gpus()[0]))
    c.TunehubLocalSpawner.profiles = profiles
    # A GPU notebook on a full pool waits in the tuner's queue, which preempts a trial for it.
    c.TunehubLocalSpawner.pool_queue_url = (
        f"{tuner_url}{tuner_service.sweeps_page_url()}api/v1/pool/requests")
    c.TunehubLocalSpawner.pool_queue_ca = str(internal.api_ca) if internal else ""

# --- services: the tuner, the idle culler ----------------------------------------------------
if opts.mode == "kubernetes":
    # The chart runs the tuner in its own Deployment: an external service the hub must not start.
    c.JupyterHub.services = [kube.tuner_service(values)]
else:
    c.JupyterHub.services = [
        tuner_service.service_definition(
            tuner_url,
            tuner_service.service_environment(
                settings, api_ca=str(internal.api_ca) if internal else None),
            opts.tuner_command,
        )
    ]
if opts.cpu_idle_timeout > 0:
    c.JupyterHub.services.append(
        culler.service_definition(
            api_url=f"{scheme}://127.0.0.1:{opts.hub_port}/hub/api",
            internal_certs=str(internal.store) if internal else None,
            cpu_timeout=opts.cpu_idle_timeout,
            gpu_timeout=opts.gpu_idle_timeout,
            gpu_profiles=[p["slug"] for p in profiles if p.get("gpus")],
            default_profile=next((p["slug"] for p in profiles if p.get("default")),
                                 profiles[0]["slug"] if profiles else ""),
            cull_every=opts.cull_every,
        )
    )
    c.JupyterHub.load_roles.append(culler.culler_role())

if opts.mode == "local":
    # A restarted hub finds the notebook servers and the proxy running (hub/hub_restart.py).
    hub_restart.configure(c, state)

if opts.mode == "kubernetes":
    # Last, so the operator's hub.config (an authenticator, anything) wins over tunehub's.
    kube_logins.apply_hub_config(c, values)

"""What every notebook server gets, whichever spawner starts it: JupyterLab, the busy-kernel
activity extension, the data store path and the tuner API's address.

The tuner client in a notebook (``tuner.Sweep.submit``) reads ``TUNEHUB_API_URL`` and
authenticates with the server's ``JUPYTERHUB_API_TOKEN``, whose tuner scopes come from
:func:`hub.scopes.configure` (``server_token_scopes``).
"""

from __future__ import annotations

from typing import Any

from hub.singleuser.busy_activity import ENV_INTERVAL as BUSY_CHECK_ENV
from tunehub_base.tls import ENV_API_CA

ENV_API_URL = "TUNEHUB_API_URL"
ENV_DATA = "TUNEHUB_DATA"

# jupyterhub-singleuser arguments: our extension on top of the ones the server enables itself.
SINGLEUSER_ARGS = ["--ServerApp.jpserver_extensions={'hub.singleuser.busy_activity': True}"]
#: JupyterLab's news pop-up ("Would you like to get notified about official Jupyter news?") and
#: update check call out to jupyter.org. Off in every mode (z2jh's default; on Kubernetes the
#: chart's notebooks.jupyterlabNews turns them back on): no news URL and no update check on the
#: server, and with no news URL our server extension (:mod:`hub.singleuser.busy_activity`)
#: disables the page's announcements plugin, which asks whatever the server says.
NO_LAB_NEWS_ARGS = ["--LabApp.news_url=None",
                    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def notebook_environment(
    api_url: str, data_path: str, activity_interval: int | None = None,
    api_ca: str | None = None,
) -> dict[str, str]:
    """Environment of a notebook server (and so of its kernels and terminals).

    ``data_path`` is where the shared data store is mounted; trials see it at the same path, so a
    path that works in a cell works in a trial. ``activity_interval`` (seconds) is how often the
    server reports its activity to the hub: it bounds how stale the culler's view can be.
    ``api_ca``: the CA the tuner client verifies ``api_url`` with (internal TLS, one machine).
    """
    env = {ENV_API_URL: api_url, ENV_DATA: data_path}
    if api_ca:
        env[ENV_API_CA] = api_ca
    if activity_interval:
        env["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(activity_interval)
        # A busy kernel is noticed as often as activity is reported: with a slower check, a
        # short GPU idle timeout could cull a server in the middle of a long cell.
        env[BUSY_CHECK_ENV] = str(activity_interval)
    return env


def configure(c: Any, api_url: str, data_path: str, activity_interval: int | None,
              lab_news: bool = False, api_ca: str | None = None) -> None:
    """Spawner settings common to the local and the Kubernetes mode."""
    c.Spawner.default_url = "/lab"
    c.Spawner.environment.update(
        notebook_environment(api_url, data_path, activity_interval, api_ca))
    news = [] if lab_news else NO_LAB_NEWS_ARGS
    c.Spawner.args = [*c.Spawner.get("args", []), *SINGLEUSER_ARGS, *news]

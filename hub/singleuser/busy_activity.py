"""A Jupyter server extension: a kernel busy running a cell counts as activity.

Why: jupyter_server only records kernel activity when a kernel sends a message, so a cell that
trains for an hour without printing looks idle, and the idle culler would stop the server in the
middle of the work. JupyterHub learns a server's activity from ``ServerApp.last_activity()``,
which takes the newest of every ``*_last_activity`` entry in the web app's settings; this
extension keeps one such entry at "now" while any kernel's execution state is ``busy``.

Enabled in every notebook server by :data:`hub.notebook.SINGLEUSER_ARGS`; being the one
extension tunehub loads there, it also installs :mod:`hub.singleuser.lab_page`'s page-config hook,
starts :mod:`hub.singleuser.gpu_reclaim` (GPU servers measure their own GPUs) and adds
:mod:`hub.singleuser.lab_notice` (its status endpoint and JupyterLab extension).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from tornado.ioloop import IOLoop, PeriodicCallback

from hub.singleuser import gpu_reclaim, lab_notice, lab_page

SETTING = "tunehub_busy_kernels_last_activity"
ENV_INTERVAL = "TUNEHUB_BUSY_CHECK_SECONDS"


def busy_kernels(kernel_manager: Any) -> list[str]:
    """Ids of the kernels currently executing code."""
    return [
        kid
        for kid in kernel_manager.list_kernel_ids()
        if getattr(kernel_manager.get_kernel(kid), "execution_state", None) == "busy"
    ]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "hub.singleuser.busy_activity"}]


def _link_jupyter_server_extension(serverapp: Any) -> None:
    lab_notice.link(serverapp)


def _load_jupyter_server_extension(serverapp: Any) -> None:
    lab_notice.add_handlers(serverapp)
    interval = float(os.environ.get(ENV_INTERVAL) or 30)
    settings = serverapp.web_app.settings
    # After every extension is loaded: JupyterHub's own sets the hook outright, replacing any
    # installed before it.
    IOLoop.current().add_callback(lab_page.install, settings)

    def check() -> None:
        if busy_kernels(serverapp.kernel_manager):
            settings[SETTING] = datetime.now(timezone.utc)

    # The GPUs' use is judged beside: a running cell is never stopped (the same rule).
    IOLoop.current().add_callback(
        gpu_reclaim.start, serverapp, lambda: bool(busy_kernels(serverapp.kernel_manager)))
    callback = PeriodicCallback(check, interval * 1000)
    callback.start()
    serverapp.log.info("tunehub: busy kernels count as activity (checked every %ss)", interval)

"""Inside a notebook server: the idle-GPU warning shown in JupyterLab itself.

Why: the person works in JupyterLab, not in their file browser's listing, so a warning that the
server's GPUs are about to be given back must appear there (issue #26). Two halves:

- ``GET <base_url>tunehub/gpu-reclaim``: the server's reclaim state as
  :class:`hub.singleuser.gpu_reclaim.Reclaimer` last stepped it (JSON; the person's own server,
  authenticated as every Jupyter API is).
- The prebuilt JupyterLab extension ``tunehub-gpu-notice`` (source in ``labextension/``, built
  files shipped in :data:`LABEXTENSIONS`) polls it and raises a JupyterLab warning notification
  while the server is warned, dismissed once its GPUs are used again.

The built extension is added to JupyterLab's ``extra_labextensions_path`` from here, so it
loads wherever this package is importable (one machine, a pod's image), with nothing installed
into ``share/jupyter`` and no Node.js at install or run time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

#: The folder holding the built ``tunehub-gpu-notice`` (``labextensions/<name>/``).
LABEXTENSIONS = str(Path(__file__).resolve().parent / "labextensions")
ROUTE = "tunehub/gpu-reclaim"
#: Where the running :class:`~hub.singleuser.gpu_reclaim.Reclaimer` is kept (web app settings).
SETTING = "tunehub_gpu_reclaim"


def link(serverapp: Any) -> None:
    """Point JupyterLab at the built extension: in the server's config, read by the ``jupyterlab``
    extension app when it links (extensions link in name order: ``hub.*`` before ``jupyterlab``),
    and on that app itself if it has linked already (its handlers are made when it loads)."""
    lab = serverapp.config.LabApp
    paths = list(lab.get("extra_labextensions_path", []))
    if LABEXTENSIONS not in paths:
        lab.extra_labextensions_path = [*paths, LABEXTENSIONS]
    for app in serverapp.extension_manager.extension_apps.get("jupyterlab", ()):
        if LABEXTENSIONS not in app.extra_labextensions_path:
            app.extra_labextensions_path = [*app.extra_labextensions_path, LABEXTENSIONS]


class GpuReclaimStatusHandler(APIHandler):
    """The reclaim state the JupyterLab extension shows."""

    @web.authenticated
    def get(self) -> None:
        running = self.settings.get(SETTING)
        status = running[0].status() if running else {"gpus": [], "state": "", "message": ""}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(status))


def add_handlers(serverapp: Any) -> None:
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(
        ".*$", [(url_path_join(base, ROUTE), GpuReclaimStatusHandler)])

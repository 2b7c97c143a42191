"""Inside a notebook server: JupyterLab's page asks nobody about jupyter.org news.

Why: JupyterLab (4.x) shows "Would you like to get notified about official Jupyter news?" on a
person's first visit whatever the server says: ``LabApp.news_url=None`` only empties the feed
and tells the page ``news.disabled``, which the announcements plugin does not read. So when the
server has no news URL (:data:`hub.notebook.NO_LAB_NEWS_ARGS`, every mode unless the chart's
``notebooks.jupyterlabNews``), this page-config hook disables that plugin, as z2jh deployments do
with ``jupyter labextension disable``, without writing into the image or the person's settings.
Installed by the server extension :mod:`hub.singleuser.busy_activity`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"
HOOK = "page_config_hook"

PageConfigHook = Callable[[Any, dict[str, Any]], dict[str, Any]]


def without_news(handler: Any, page_config: dict[str, Any]) -> dict[str, Any]:
    """The page config with the announcements plugin disabled when the server has no news."""
    if page_config.get("news", {}).get("disabled"):
        disabled = page_config.get("disabledExtensions")
        if isinstance(disabled, list):  # the older list form
            page_config["disabledExtensions"] = [*disabled, ANNOUNCEMENTS]
        else:
            page_config["disabledExtensions"] = {**(disabled or {}), ANNOUNCEMENTS: True}
    return page_config


def install(web_settings: dict[str, Any]) -> None:
    """Add :func:`without_news` after any page-config hook already set (JupyterHub's
    singleuser extension sets one that fills in the hub's user and URLs)."""
    before: PageConfigHook | None = web_settings.get(HOOK)

    def hook(handler: Any, page_config: dict[str, Any]) -> dict[str, Any]:
        return without_news(handler, before(handler, page_config) if before else page_config)

    web_settings[HOOK] = hook

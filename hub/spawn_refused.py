"""The one exception both spawners raise when a spawn cannot work.

Why a ``SpawnException``: JupyterHub treats it as a refusal, not a hub error: the REST API answers
400 with the message (not 500), the spawn page shows the message as it is, the log gets one line
instead of a traceback, and it does not count toward ``Spawner.consecutive_failure_limit`` (which
would restart the hub). A spawn that cannot work because of the platform's own set-up (not the
request) answers 503 with its reason instead: still a message, never a bare 500.
"""

from __future__ import annotations

from jupyterhub.spawner import SpawnException


class SpawnRefused(SpawnException):
    """A spawn that cannot work, with the reason the user reads."""

    def __init__(self, message: str, *, reason: str = "capacity", status_code: int = 400,
                 log_message: str = "") -> None:
        super().__init__(message, reason=reason, status_code=status_code,
                         log_message=log_message)

    def __str__(self) -> str:  # JupyterHub shows str() on the spawn page: not "HTTP 400: ..."
        return self.message

"""Which of the pool's configured hub groups each person belongs to, read from the hub.

Why: a team's GPU quota (``groups:`` in ``TUNEHUB_POOL_SHARES``, :mod:`tunehub_base.pool.shares`)
must count the team's trials, not only its notebooks. A notebook's request carries its owner's
groups (the spawner knows them); a sweep's trials are asked for by the tuner, which knows only
the owner's name. So the tuner reads the members of each *configured* group from the hub API
(``GET /hub/api/groups/<name>``, scope ``read:groups``, granted to the tuner service by
:func:`hub.scopes.tuner_service_role`) every :data:`REFRESH_SECONDS`, and the pool asks
:meth:`HubGroups.of` when it builds a trial's request. Membership is as the hub had it at the
last read: someone added to a team counts against its quota from the next read on.

On one machine only the groups the shares name are read (a hub may have thousands of groups;
only those with a weight or a cap change a decision). On Kubernetes, where Kueue decides and
the tuner only keeps GPU-hours, every group is read (``GET /hub/api/groups``, a page at a
time), so a pod's GPU-hours count for each group its person was a member of when it started
(:mod:`tuner.pool_sources.kube_recorder`). A group the hub does not have counts nobody; a hub
that does not answer leaves the last membership in force and is said once in the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from urllib.parse import quote

import httpx

log = logging.getLogger("tunehub.hub_groups")

#: How often the configured groups' members are read again from the hub.
REFRESH_SECONDS = 30.0
#: Groups asked per request when every group is read.
PAGE = 200


class HubGroups:
    """Membership of the configured hub groups, as last read from the hub API."""

    def __init__(self, api_url: str, token: str, verify: object = True) -> None:
        """``api_url``: the hub's API (``JUPYTERHUB_API_URL``); ``token``: the service's own;
        ``verify``: how the hub's certificate is checked (an SSL context under internal TLS)."""
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.verify = verify
        self._members: dict[str, frozenset[str]] = {}
        self._failing = False

    @classmethod
    def from_environment(cls) -> HubGroups | None:
        """The reader for a service the hub started or registered (its ``JUPYTERHUB_*``
        variables), with the hub's internal TLS where the hub uses it; None elsewhere (a
        CLI run: nobody's groups are known, everyone is a person)."""
        api_url, token = os.environ.get("JUPYTERHUB_API_URL"), os.environ.get(
            "JUPYTERHUB_API_TOKEN")
        if not api_url or not token:
            return None
        verify: object = True
        certfile = os.environ.get("JUPYTERHUB_SSL_CERTFILE")
        keyfile = os.environ.get("JUPYTERHUB_SSL_KEYFILE")
        if certfile and keyfile:
            from jupyterhub.utils import make_ssl_context

            verify = make_ssl_context(keyfile, certfile,
                                      cafile=os.environ.get("JUPYTERHUB_SSL_CLIENT_CA"))
        return cls(api_url, token, verify)

    def of(self, person: str) -> tuple[str, ...]:
        """The configured groups ``person`` was a member of at the last read, sorted."""
        return tuple(sorted(g for g, members in self._members.items() if person in members))

    def members(self, group: str) -> list[str] | None:
        """Who counts against ``group``'s share, sorted; None before its first read."""
        found = self._members.get(group)
        return sorted(found) if found is not None else None

    async def refresh(self, names: Iterable[str] | None) -> None:
        """Read the members of each group in ``names`` (the others are forgotten); None:
        of every group the hub has (Kubernetes, where GPU-hours are kept per group)."""
        members: dict[str, frozenset[str]] = {}
        try:
            async with httpx.AsyncClient(verify=self.verify, timeout=10) as client:  # type: ignore[arg-type]
                if names is None:
                    members = await self._every_group(client)
                for name in sorted(set(names or ())):
                    r = await client.get(f"{self.api_url}/groups/{quote(name, safe='')}",
                                         headers={"Authorization": f"token {self.token}"})
                    if r.status_code == 404:
                        members[name] = frozenset()
                        continue
                    r.raise_for_status()
                    members[name] = frozenset(str(u) for u in r.json().get("users") or ())
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if not self._failing:
                log.warning("could not read the pool's hub groups (%s); the last membership "
                            "read stays in force", exc)
            self._failing = True
            return
        if self._failing:
            log.info("the pool's hub groups are read again")
        self._failing = False
        self._members = members

    async def _every_group(self, client: httpx.AsyncClient) -> dict[str, frozenset[str]]:
        """Every group's members, a page of :data:`PAGE` at a time (the hub's API pages its
        lists)."""
        found: dict[str, frozenset[str]] = {}
        offset = 0
        while True:
            r = await client.get(f"{self.api_url}/groups",
                                 params={"offset": offset, "limit": PAGE},
                                 headers={"Authorization": f"token {self.token}"})
            r.raise_for_status()
            page = r.json()
            for group in page:
                found[str(group["name"])] = frozenset(str(u) for u in group.get("users") or ())
            if len(page) < PAGE:
                return found
            offset += len(page)

    async def keep_reading(self, names: Callable[[], Iterable[str]] | None,
                           every: float = REFRESH_SECONDS) -> None:
        """Refresh every ``every`` seconds with the group names configured at that moment
        (None: every group)."""
        while True:
            await self.refresh(names() if names is not None else None)
            await asyncio.sleep(every)  # a period, not synchronisation

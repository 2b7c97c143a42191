"""A report that reaches a tuner which does not run its trial, with several tuners on one
database (the chart's ``tuner.replicas``): sent on to the one that does.

Trials report to one address for all replicas (the tuner's Service), so a report may land on any
of them. The replica whose controller runs the trial's sweep recorded where it takes reports in
its claim (``controller_url``, :meth:`~tuner.lifecycle.ledger.Ledger.claim`); any other replica
checks the trial's token against the trial's row first (so it is no open relay, and a stranger
learns nothing it would not learn from the owner), then forwards the request as it came, once
(a forwarded request is never forwarded again), and relays the answer. While the sweep has no
live controller (its replica died and another has not taken it over yet, which
:func:`tuner.service.adopt_orphans` does within a heartbeat or two) the answer is 503 with
``Retry-After``: the SDK sends the report again, and the new owner takes it.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from enum import Enum

from sqlalchemy import select
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from tuner.db import Database, SweepRow, Trial
from tuner.db.outage import patient
from tuner.lifecycle.liveness import controller_alive
from tuner.lifecycle.states import TrialState
from tuner.scheduling.trial_env import token_matches

#: Set on a request one replica sends on to another: it is answered there, never sent again.
FORWARDED = "X-Tunehub-Forwarded"
#: How long a forwarded report may take (the owner answers once the value is committed).
FORWARD_SECONDS = 30.0


class Route(Enum):
    REFUSED = "refused"  # no running attempt of this trial takes this token
    FORWARD = "forward"  # the sweep's controller runs on the replica at ``url``
    MOVING = "moving"  # the sweep's controller died; another replica takes it over soon


@dataclass(frozen=True)
class Routing:
    route: Route
    url: str | None = None


@patient
def _lookup(db: Database, trial_id: int) -> tuple[Trial, SweepRow] | None:
    with db.session() as s:
        row = s.execute(select(Trial, SweepRow).join(SweepRow, SweepRow.id == Trial.sweep_id)
                        .where(Trial.id == trial_id)).first()
        return None if row is None else (row[0], row[1])


async def route_report(db: Database, own_url: str, trial_id: int, token: str) -> Routing:
    """Where a report of ``trial_id`` with ``token`` goes when this replica does not run it
    (a database read, off the event loop)."""
    found = await asyncio.to_thread(_lookup, db, trial_id)
    if found is None:
        return Routing(Route.REFUSED)
    trial, sweep = found
    if (trial.state != TrialState.RUNNING or not trial.token_hash
            or not token_matches(token, trial.token_hash)):
        return Routing(Route.REFUSED)
    if sweep.controller_url and sweep.controller_url != own_url and controller_alive(sweep):
        return Routing(Route.FORWARD, sweep.controller_url)
    return Routing(Route.MOVING)


async def forward(url: str, trial_id: int, body: bytes, authorization: str) -> tuple[int, bytes]:
    """POST the report to the replica at ``url``; its status and body. A replica that does
    not answer is reported as 503 (the SDK tries again)."""
    request = HTTPRequest(
        f"{url.rstrip('/')}/api/v1/trials/{trial_id}/report", method="POST", body=body,
        headers={"Authorization": authorization, "Content-Type": "application/json",
                 FORWARDED: "1"},
        request_timeout=FORWARD_SECONDS,
        # Replicas serve with the hub's internal certificates where it has them.
        ca_certs=os.environ.get("JUPYTERHUB_SSL_CLIENT_CA") or None,
    )
    try:
        response = await AsyncHTTPClient().fetch(request)
    except HTTPClientError as exc:
        if exc.response is None:
            return 503, b""
        return exc.code, exc.response.body or b""
    except OSError:
        return 503, b""
    return response.code, response.body or b""

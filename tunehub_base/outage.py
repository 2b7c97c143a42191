"""How long an outage of the tuner's database is waited out: one bound for every side.

The controllers and the tuner service (:mod:`tuner.db.outage`), the trial SDK's report
(:mod:`tuner.sdk.training`) and the notebook client (:mod:`tuner.sdk.client`) all wait up to
:data:`OUTAGE_SECONDS` for the database to return, so an outage the controllers ride out is one
a notebook call and a trial's report ride out too. It lives here, in the floor, because the
notebook client and the trial SDK must not import the database layer (SQLAlchemy) to read it.
"""

from __future__ import annotations

__all__ = ["OUTAGE_SECONDS", "REQUEST_KEY", "RETRY_AFTER_SECONDS"]

#: How long a caller that waits for the database (a controller, the service adopting its
#: sweeps, a trial's report, a notebook call answered 503) waits in all before it gives up and
#: reports the outage.
OUTAGE_SECONDS = 900.0
#: What a 503 tells the client to wait before it asks again.
RETRY_AFTER_SECONDS = 2
#: The header a client names a request with (the same on each retry of it) so that the
#: request, sent again after its answer was lost, takes effect once: a sweep's submission.
REQUEST_KEY = "Idempotency-Key"

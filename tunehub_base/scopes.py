"""The tuner's custom JupyterHub scopes: their names and what each lets a caller do.

The hub grants them (:mod:`hub.scopes`, :mod:`hub.tuner_service`) and the tuner's API checks
them (:mod:`tuner.api.auth`). Both sides import the names from here, a module that imports
nothing, so the hub's configuration does not load the tuner's API (Tornado handlers, SQLAlchemy,
Optuna) to learn four strings.
"""

from __future__ import annotations

READ = "custom:tuner:read"
SUBMIT = "custom:tuner:submit"
ADMIN = "custom:tuner:admin"
HIGH_PRIORITY = "custom:tuner:priority-high"
SCOPES = {
    READ: "See your sweeps, trials and models in the tuner.",
    SUBMIT: "Submit, cancel and resume your sweeps; promote your models.",
    ADMIN: "See and change every user's sweeps and models.",
    HIGH_PRIORITY: "Submit sweeps with priority: high.",
}

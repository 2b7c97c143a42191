"""Who may use a model name: the one rule, for a sweep's submission and for registration.

Model names are one namespace for everyone (the registry's directories are what TensorFlow
Serving reads), so a name belongs to one person: the first whose sweep names it in
``promote.model`` (claimed at submission, before the sweep runs) or who registers a version
under it. Only that person's sweeps register versions under it, admins included: an admin's
sweep that took another person's name would mix two owners' versions under one model. Admins
still see and promote (give a stage to) every existing version; that is the registry's
``promote``, not a claim.

A submission is checked against the claim first (a quick refusal, before its code is copied)
and claims the name once it has passed every check. The claim is a row with the name as its
primary key, so of two people submitting at the same moment exactly one gets it, in any
database. A claim is kept when its sweep ends, whatever the outcome: a sweep that registered
nothing (failed, cancelled, no saved model) keeps its owner's name for the next run, as a
registered name is kept. An operator frees a name by deleting its row from
``tunehub_model_names`` (and the model's versions, if any).
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from tuner.db import Database, ModelName
from tuner.errors import Forbidden


class NameTaken(Forbidden):
    """The name belongs to someone else; the message never says to whom."""

    def __init__(self, model: str) -> None:
        super().__init__(f"the model name {model!r} is taken by another user; choose another "
                         "name")


def claim(db: Database, model: str, owner: str) -> bool:
    """Make ``model`` ``owner``'s, or raise :class:`NameTaken` when it is someone else's.
    True when this call claimed it (it was free), False when it was ``owner``'s already."""
    for _ in range(3):
        try:
            with db.session() as s:
                row = s.get(ModelName, model)
                if row is None:
                    s.add(ModelName(name=model, owner=owner))
                    s.flush()
                    return True
                if row.owner != owner:
                    raise NameTaken(model)
                return False
        except IntegrityError:
            continue  # claimed by someone else between our read and our write: read again
    raise NameTaken(model)


def check(db: Database, model: str, owner: str) -> None:
    """:class:`NameTaken` unless ``model`` is free or ``owner``'s (nothing is claimed)."""
    with db.session() as s:
        row = s.get(ModelName, model)
        if row is not None and row.owner != owner:
            raise NameTaken(model)

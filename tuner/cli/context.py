"""What every command needs: settings, the database, the acting user."""

from __future__ import annotations

import functools

from tunehub_base.settings import Settings, load_settings
from tuner.db import Database
from tuner.sweep_store import Actor, SweepStore, local_actor


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    return load_settings().ensure_dirs()


@functools.lru_cache(maxsize=1)
def database() -> Database:
    return Database(settings().db_url)


def store() -> SweepStore:
    return SweepStore(database(), settings())


def actor() -> Actor:
    return local_actor()

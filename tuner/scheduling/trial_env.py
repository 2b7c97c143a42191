"""What an attempt is given to run with: its token and its environment.

A token is made per attempt and only its SHA-256 is kept (the trial row, the controller's
memory), so a leaked database reveals no token and a token dies with its attempt. The
environment is what the trial SDK (:mod:`tuner.sdk.training`) reads: where to report, as whom, with
which parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunehub_base.tls import ENV_API_CA
from tuner.sdk.training import (
    ENV_API_URL,
    ENV_ARTIFACT_DIR,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_DATA,
    ENV_PARAMS,
    ENV_TOKEN,
    ENV_TRIAL_ID,
)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A fresh attempt token and its hash: the token goes to the attempt, the hash is kept."""
    token = secrets.token_urlsafe(32)
    return token, hash_token(token)


def token_matches(token: str, token_hash: str) -> bool:
    """Whether ``token`` is the one ``token_hash`` was made from (constant time)."""
    return secrets.compare_digest(hash_token(token), token_hash)


@dataclass(frozen=True)
class AttemptIdentity:
    """Which attempt of which trial of which sweep, and how it reaches its controller."""

    sweep_id: int
    trial_id: int
    number: int
    attempt: int
    token: str
    api_url: str


def trial_env(
    spec_env: Mapping[str, str],
    who: AttemptIdentity,
    params: Mapping[str, Any],
    artifact_dir: Path,
    data_dir: Path,
    checkpoint_dir: Path | None = None,
) -> dict[str, str]:
    """The spec's ``env`` plus what the trial SDK reads (these win over the spec's)."""
    env = dict(spec_env)
    api_ca = os.environ.get(ENV_API_CA)  # the platform's, for this service's own TLS port
    if api_ca:
        env[ENV_API_CA] = api_ca
    env.update(
        {
            ENV_API_URL: who.api_url,
            ENV_TRIAL_ID: str(who.trial_id),
            ENV_ATTEMPT: str(who.attempt),
            ENV_TOKEN: who.token,
            ENV_PARAMS: json.dumps(dict(params)),
            ENV_ARTIFACT_DIR: str(artifact_dir),
            ENV_DATA: str(data_dir),
            "TUNEHUB_SWEEP_ID": str(who.sweep_id),
            "TUNEHUB_TRIAL_NUMBER": str(who.number),
        }
    )
    if checkpoint_dir is not None:  # the trial's, not the attempt's: a retry resumes from it
        env[ENV_CHECKPOINT_DIR] = str(checkpoint_dir)
    return env

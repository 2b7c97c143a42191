"""A backend whose trials finish the moment they are launched.

The scale benchmark is about the controller's own cost (ask, launch, tell) as a sweep grows to
10,000 trials; starting 10,000 real processes would measure fork and the trial SDK instead and
take far longer on a 2-core machine. This backend keeps the controller's whole path (its
database rows, working directories, log files, backend events, the report route with its token
check, Optuna's tell) and replaces only the process: it evaluates a trivial objective on the
trial's parameters and reports through :meth:`tuner.controller.Engine.report` like the HTTP
handler does.
"""

from __future__ import annotations

import json
from typing import Any

from tuner.backends._base import Backend, TrialEvent, TrialLaunch
from tuner.controller import Engine
from tuner.trial import ENV_PARAMS, ENV_TOKEN


def quadratic(params: dict[str, Any]) -> float:
    """The trivial objective: a smooth bowl with its top at x=0.3, y=0.6."""
    return 1.0 - (float(params["x"]) - 0.3) ** 2 - (float(params["y"]) - 0.6) ** 2


class InstantBackend(Backend):
    """Runs every attempt instantly in this process; see the module docstring for why."""

    name = "instant"

    def __init__(self, steps: int = 0) -> None:
        """``steps``: intermediate reports per trial (the objective scaled by step/steps, the
        last one marked last), each judged by the sweep's pruner; a pruned trial stops."""
        super().__init__()
        self.engine: Engine | None = None
        self.launched = 0
        self.steps = steps

    def bind(self, engine: Engine) -> None:
        """The engine whose report route the "trials" call (set after the engine exists)."""
        self.engine = engine

    async def launch(self, launch: TrialLaunch) -> None:
        assert self.engine is not None, "bind() the engine first"
        self.launched += 1
        await self.emit(TrialEvent(launch.trial_id, launch.attempt, "started"))
        value = quadratic(json.loads(launch.env[ENV_PARAMS]))
        token = launch.env[ENV_TOKEN]
        pruned = False
        for step in range(1, self.steps + 1):
            pruned = self.engine.report(launch.trial_id, token, launch.attempt,
                                        value * step / self.steps, step, last=step == self.steps)
            if pruned:
                break
        if not pruned:
            self.engine.report(launch.trial_id, token, launch.attempt, value, None)
        await self.emit(TrialEvent(launch.trial_id, launch.attempt, "succeeded", 0))

    async def cancel(self, trial_id: int, attempt: int) -> None:
        """Nothing runs between launch and its events, so there is nothing to stop."""

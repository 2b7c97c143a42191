"""The notebook client: ``tuner.Sweep.submit(...)`` from a cell, over the tuner's REST API.

Inside a hub notebook the server's token (``JUPYTERHUB_API_TOKEN``, scoped for the tuner) and
``TUNEHUB_API_URL`` are set by the spawner, so no configuration is needed. Specs are validated
here first, with the same messages as the service.
"""

from __future__ import annotations

import base64
import builtins  # `list` names a method of a class below: its annotations say builtins.list
import logging
import os
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tunehub_base.outage import OUTAGE_SECONDS, REQUEST_KEY
from tunehub_base.tls import api_context
from tuner.errors import Conflict, Forbidden, NotFound, TunehubError, Unauthorized
from tuner.lifecycle.states import SweepState, TrialState, trials_done
from tuner.sdk.run_function import COMMAND as FUNCTION_COMMAND
from tuner.spec import SpecError, SweepSpec

log = logging.getLogger("tunehub.client")

_ERRORS: dict[int, type[TunehubError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
}


class TunerClient:
    """A thin HTTP client for the tuner API."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        url = url or os.environ.get("TUNEHUB_API_URL")
        if not url:
            raise TunehubError(
                "TUNEHUB_API_URL is not set: run this in a tunehub notebook, or pass url="
            )
        self.url = url.rstrip("/") + "/api/v1/"
        token = token or os.environ.get("TUNEHUB_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN")
        headers = {"Authorization": f"token {token}"} if token else {}
        # On one machine the platform's URL is the tuner's own TLS port: verify it is the
        # tuner (TUNEHUB_API_CA and its name) before the token is sent.
        self.http = httpx.Client(headers=headers, timeout=60, trust_env=False,
                                 verify=api_context() or True)
        #: Since when the tuner answers 503 (its database away), while it does.
        self._unavailable_since: float | None = None

    def request(self, method: str, path: str, json: Any = None,
                headers: dict[str, str] | None = None) -> Any:
        response = self._send(method, path, json, headers)
        if response.status_code >= 400:
            try:
                body = response.json()
                message, field = body.get("error", response.text), body.get("field")
            except ValueError:
                message, field = response.text.strip()[:200], None
            if response.status_code == 400 and field:
                raise SpecError(field, message.removeprefix(f"{field}: "))
            raise _ERRORS.get(response.status_code, TunehubError)(message)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def _send(self, method: str, path: str, json: Any,
              headers: dict[str, str] | None = None) -> httpx.Response:
        """One request, sent again while the tuner is away for a while, for up to
        :data:`OUTAGE_SECONDS` from the first refusal: the bound the tuner's controllers wait
        an outage out for, so a call gives up only once the sweeps behind it have too. Away
        means it answers 503 (its database is away; sent again after its ``Retry-After``), or
        nothing listens on its port (the service is being started again: killed, its keeper
        starts it; nothing was sent, so any request may be sent again). A certificate that
        fails verification is no outage: it is said at once, never retried into. The outage
        is said once per client (and that it is over), not once per call."""
        deadline: float | None = None
        delay = 0.5
        while True:
            try:
                answer = self.http.request(method, self.url + path.lstrip("/"), json=json,
                                           headers=headers)
            except httpx.ConnectError as exc:
                if _not_verified(exc):
                    raise TunehubError(f"cannot reach the tuner at {self.url}: {exc}") from None
                response: httpx.Response | None = None
                away = f"cannot connect: {exc}"
            except httpx.HTTPError as exc:
                raise TunehubError(f"cannot reach the tuner at {self.url}: {exc}") from None
            else:
                if answer.status_code != 503:
                    if self._unavailable_since is not None:
                        log.warning("the tuner answers again after %.0f s; carrying on",
                                    time.time() - self._unavailable_since)
                        self._unavailable_since = None
                    return answer
                response, away = answer, _error_of(answer)
                try:
                    delay = max(delay, float(answer.headers.get("Retry-After", delay)))
                except ValueError:
                    pass
            now = time.monotonic()
            if deadline is None:
                deadline = now + OUTAGE_SECONDS
            elif now > deadline:
                if response is None:
                    raise TunehubError(f"cannot reach the tuner at {self.url}: {away}")
                return response
            if self._unavailable_since is None:
                self._unavailable_since = time.time()
                log.warning("the tuner is unavailable since %s (%s), retrying",
                            time.strftime("%H:%M:%S"), away)
            time.sleep(min(delay, 10.0))  # backoff between retries of an unavailable service
            delay = min(delay * 2, 10.0)


def _not_verified(exc: BaseException) -> bool:
    """Whether a failed connection failed on TLS (a certificate not the tuner's, a server that
    speaks no TLS): whoever holds the port is not the tuner, and waiting will not make it so."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain of causes is short; bounded should one ever loop
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _error_of(response: httpx.Response) -> str:
    """The error a tuner's answer gives (its JSON body's), for a message."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or f"HTTP {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    return str(error) if error else f"HTTP {response.status_code}"


class SweepPlots(dict[str, Any]):
    """The figures of :meth:`Sweep.plot` by name. Why not a plain dict: a notebook shows a
    dict as its text, so the README's ``sweep.plot()`` drew nothing; this one draws each
    figure when it is a cell's result, and is still a dict for code that picks one."""

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for figure in self.values():
            display(figure)

class Sweep:
    """A sweep on the tuner service, seen from a notebook."""

    def __init__(self, data: dict[str, Any], client: TunerClient) -> None:
        self._data = data
        self.client = client

    # --- creating and finding ------------------------------------------------------------

    @classmethod
    def submit(
        cls,
        spec: Mapping[str, Any] | str | Path | SweepSpec | None = None,
        *,
        function: Callable[[dict[str, Any]], float | None] | None = None,
        backend: str | None = None,
        client: TunerClient | None = None,
        **fields: Any,
    ) -> Sweep:
        """Submit a sweep: a spec (mapping, YAML path or :class:`SweepSpec`) and/or fields
        as keyword arguments; ``function`` runs a notebook function as each trial
        (``function(params) -> metric``) instead of ``command``."""
        if isinstance(spec, str | Path):
            parsed = SweepSpec.from_yaml(spec)
            data = parsed.to_dict()
        elif isinstance(spec, SweepSpec):
            data = spec.to_dict()
        else:
            data = dict(spec or {})
        data.update(fields)
        body: dict[str, Any] = {}
        if function is not None:
            import cloudpickle

            if data.get("command"):
                raise SpecError("command", "give either a command or a function")
            data["command"] = FUNCTION_COMMAND
            body["function"] = base64.b64encode(cloudpickle.dumps(function)).decode()
        elif data.get("code") is None and data.get("command"):
            data["code"] = os.getcwd()  # the notebook's directory, like a spec file's
        SweepSpec.from_dict(data)  # fail here, with the same message, before any request
        body["spec"] = data
        if backend:
            body["backend"] = backend
        client = client or TunerClient()
        # One name for this submission, the same on each retry: a 503 whose database had
        # committed the sweep before the answer was lost is sent again and makes no second.
        key = {REQUEST_KEY: uuid.uuid4().hex}
        return cls(client.request("POST", "sweeps", body, headers=key), client)

    @classmethod
    def get(cls, sweep_id: int, client: TunerClient | None = None) -> Sweep:
        """Reattach to a sweep, e.g. after a kernel restart."""
        client = client or TunerClient()
        return cls(client.request("GET", f"sweeps/{int(sweep_id)}"), client)

    @classmethod
    def list(cls, client: TunerClient | None = None) -> list[Sweep]:
        client = client or TunerClient()
        return [cls(d, client) for d in client.request("GET", "sweeps")]

    # --- state ---------------------------------------------------------------------------

    @property
    def id(self) -> int:
        return int(self._data["id"])

    @property
    def state(self) -> str:
        return str(self._data["state"])

    @property
    def info(self) -> dict[str, Any]:
        return dict(self._data)

    def refresh(self) -> Sweep:
        self._data = self.client.request("GET", f"sweeps/{self.id}")
        return self

    def __repr__(self) -> str:
        d = self._data
        return (
            f"<Sweep {d['id']} {d['name']!r} {d['state']}: {d[TrialState.COMPLETED]}/{d['trials']} "
            f"completed, best {d['metric']}={d['best_value']}>"
        )

    def trial_list(self) -> builtins.list[dict[str, Any]]:
        return list(self.client.request("GET", f"sweeps/{self.id}/trials"))

    def trials(self) -> Any:
        """The trials as a pandas DataFrame: one row per trial, a column per parameter."""
        import pandas as pd

        rows = []
        for t in self.trial_list():
            row = {k: t[k] for k in ("number", "state", "value", "attempts", "reason")}
            row.update({f"params_{k}": v for k, v in t["params"].items()})
            row["steps"] = len(t.get("intermediate_values") or [])
            row["duration_seconds"] = t.get("duration_seconds")
            rows.append(row)
        return pd.DataFrame(rows).set_index("number") if rows else pd.DataFrame()

    @property
    def best(self) -> dict[str, Any] | None:
        """The best completed trial (number, value, params)."""
        self.refresh()
        number = self._data.get("best_trial")
        if number is None:
            return None
        for t in self.trial_list():
            if t["number"] == number:
                return t
        return None

    def logs(self, number: int) -> str:
        return str(self.client.request("GET", f"sweeps/{self.id}/trials/{int(number)}/logs"))

    # --- actions -------------------------------------------------------------------------

    def cancel(self) -> Sweep:
        self._data = self.client.request("POST", f"sweeps/{self.id}/cancel")
        return self

    def resume(self) -> Sweep:
        self._data = self.client.request("POST", f"sweeps/{self.id}/resume")
        return self

    def model_versions(self) -> builtins.list[dict[str, Any]]:
        model = ((self._data.get("spec") or {}).get("promote") or {}).get("model")
        if not model:
            return []
        versions = self.client.request("GET", f"models/{model}")
        return [v for v in versions if v.get("sweep_id") == self.id]

    def promote(self, stage: str = "production") -> dict[str, Any]:
        """Move ``stage`` to the model version this sweep registered."""
        versions = self.model_versions()
        if not versions:
            raise Conflict(f"sweep {self.id} has not registered a model version")
        v = versions[-1]
        return dict(
            self.client.request(
                "POST", f"models/{v['model']}/versions/{v['version']}/promote", {"stage": stage}
            )
        )

    def watch(self, interval: float = 1.0, timeout: float | None = None) -> Sweep:
        """A live progress bar (a widget in notebooks, text elsewhere) until the sweep ends;
        then the leaderboard."""
        from tqdm.auto import tqdm

        self.refresh()
        deadline = None if timeout is None else time.monotonic() + timeout
        with tqdm(total=self._data["trials"], desc=f"sweep {self.id}", unit="trial") as bar:
            while True:
                d = self._data
                bar.n = trials_done(d)
                bar.set_postfix(best=d["best_value"], pruned=d[TrialState.PRUNED],
                                failed=d[TrialState.FAILED])
                bar.refresh()
                if SweepState(d["state"]).is_finished():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(interval)  # refresh interval of a progress display
                self.refresh()
        self._show_leaderboard()
        d = self._data
        if d.get("cold_start"):
            print(f"note: {d['cold_start']}")
        if d["state"] in (SweepState.FAILED, SweepState.CANCELLED) and d.get("reason"):
            # Why, in front of the user: for a failed sweep the failing trial's last lines.
            print(f"sweep {self.id} {d['state']}: {d['reason']}")
        return self

    def _show_leaderboard(self) -> None:
        frame = self.trials()
        if frame.empty:
            return
        ascending = self._data.get("direction") == "minimize"
        top = frame[frame["value"].notna()].sort_values("value", ascending=ascending).head(10)
        try:
            from IPython.display import display

            display(top)
        except ImportError:
            print(top.to_string())

    def plot(self) -> SweepPlots:
        """Optuna's optimisation history and parameter importances (plotly figures, drawn one
        after the other when a notebook shows the result), and, for a sweep that trades its
        metric against a cost, the Pareto front with the budget and the chosen model
        (:mod:`tuner.sdk.pareto`)."""
        import optuna

        from tuner.sdk.pareto import pareto_data, pareto_figure
        from tuner.search.study import OPTUNA_STATES

        self.refresh()
        spec = SweepSpec.from_dict(self._data["spec"])
        study = optuna.create_study(direction=spec.direction)
        dists = spec.distributions()
        for t in self.trial_list():
            if t["state"] not in OPTUNA_STATES or t["value"] is None:
                continue
            params = {k: v for k, v in t["params"].items() if k in dists}
            study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions={k: dists[k] for k in params},
                    value=t["value"] if t["state"] == TrialState.COMPLETED else None,
                    intermediate_values={
                        r["step"]: r["value"] for r in t.get("intermediate_values") or []
                    },
                    state=OPTUNA_STATES[t["state"]],
                )
            )
        # (A multi-objective sweep's history is its primary metric's: study has that one.)
        figures = SweepPlots(history=optuna.visualization.plot_optimization_history(study))
        pareto = pareto_data(spec, self.trial_list())
        if pareto is not None:
            figures["pareto"] = pareto_figure(pareto)
        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if len(completed) >= 2 and len(dists) >= 1:
            figures["importance"] = optuna.visualization.plot_param_importances(study)
        return figures

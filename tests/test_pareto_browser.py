"""The Pareto front on the Sweeps page, in a real browser (issue 27's browser test): a digits
sweep where width buys accuracy and costs size, with a size budget; the page draws the trials,
the front, the budget as a line and the promoted model as a star, and the star is the best
model within the budget, not the most accurate one. The notebook's ``sweep.plot()`` on the same
sweep returns the same Pareto figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.polling import wait_for
from tests.service_fixtures import running_tuner_hub
from tests.sweeps_helpers import write_sweep
from tests.test_promotion_budget import train_code
from tuner.sdk.client import Sweep, TunerClient

pytestmark = pytest.mark.slow

SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]
BUDGET_MB = 1.0
#: Width buys accuracy and costs size: the widest model breaks the size budget (no extra
#: serving passes here: the chart is of accuracy against size).
TRAIN = train_code(wide=1024, passes=0)
SPACE = {"units": {"type": "categorical", "choices": [2, 32, 1024]}}


def _pareto(hub_url: str, user: str, sweep_id: int) -> dict[str, Any]:
    """What the Sweeps page's Pareto chart drew for ``sweep_id``: its data attributes and the
    names of its traces (plotly keeps them on the element)."""
    from tests.test_hub_browser import sweeps_page

    with sweeps_page(hub_url, user) as page:
        page.locator("#sweeps tbody tr").first.wait_for(timeout=120_000)
        page.goto(f"{hub_url}services/tuner/#sweep={sweep_id}")
        page.locator("#pareto-figure").wait_for(state="visible", timeout=120_000)
        page.wait_for_function(
            "!!document.getElementById('pareto-chart').dataset.chosen "
            "&& (document.getElementById('pareto-chart').data || []).length > 0",
            timeout=120_000)
        drawn: dict[str, Any] = page.evaluate(
            """() => { const c = document.getElementById('pareto-chart');
                       return {front: c.dataset.front, chosen: c.dataset.chosen,
                               budget: c.dataset.budget,
                               traces: c.data.map((t) => t.name),
                               budget_x: (c.data.find((t) => t.name.startsWith('budget'))
                                          || {x: []}).x}; }""")
        return drawn


def test_the_pareto_front_budget_and_chosen_model_are_drawn(tmp_path: Path) -> None:
    with running_tuner_hub(
        tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}",
        extra_config='c.JupyterHub.services[1]["oauth_no_confirm"] = True\n',
    ) as hub:
        ana = hub.client(hub.token("ana", SUBMIT))
        path = write_sweep(
            hub.data / "code", TRAIN, name="pareto", trials=3, parallelism=1, sampler="grid",
            metric="val_accuracy", space=SPACE,
            metrics=[{"name": "val_accuracy", "direction": "maximize"},
                     {"name": "model_size_mb"}],
            promote={"model": "digits", "policy": "if-better",
                     "constraints": {"size_mb": BUDGET_MB}},
        )
        spec = yaml.safe_load(path.read_text())
        spec["code"] = str(path.parent)
        r = ana.post("sweeps", json={"spec": spec})
        assert r.status_code == 201, r.text
        sweep_id = int(r.json()["id"])
        wait_for(lambda: ana.get(f"sweeps/{sweep_id}").json()["state"]
                 in ("completed", "failed"), timeout=1200, what="the sweep to end")
        sweep = ana.get(f"sweeps/{sweep_id}").json()
        assert sweep["state"] == "completed", sweep
        trials = {t["params"]["units"]: t for t in ana.get(f"sweeps/{sweep_id}/trials").json()}
        within = [t for t in trials.values() if t["metrics"]["model_size_mb"] <= BUDGET_MB]
        best_within = max(within, key=lambda t: t["value"])
        assert trials[1024]["metrics"]["model_size_mb"] > BUDGET_MB  # the widest breaks it

        # The notebook's sweep.plot() on the same finished sweep: the Pareto figure with the
        # budget line and the chosen model, as the page draws it.
        client = TunerClient(url=f"{hub.url}services/tuner", token=hub.token("ana", SUBMIT))
        figures = Sweep.get(sweep_id, client=client).plot()
        assert {"history", "pareto"} <= set(figures), list(figures)
        pareto = figures["pareto"]
        names = [t.name for t in pareto.data]
        assert names[:2] == ["trials", "Pareto front"], names
        assert names[2] == f"chosen: trial {best_within['number']}", names
        star = pareto.data[2]
        assert (list(star.x), list(star.y)) == ([best_within["metrics"]["model_size_mb"]],
                                                [best_within["value"]])
        assert [shape.x0 for shape in pareto.layout.shapes] == [BUDGET_MB]  # the budget line
        assert pareto.layout.xaxis.title.text == "model_size_mb (minimize)"
        client.http.close()

        drawn = _pareto(hub.url, "ana", sweep_id)
        assert drawn["chosen"] == str(best_within["number"]), (drawn, trials)
        assert drawn["budget"] == f"model_size_mb {BUDGET_MB:g}"
        assert drawn["budget_x"] == [BUDGET_MB, BUDGET_MB]
        assert {"trials", "Pareto front", f"chosen: trial {best_within['number']}"} \
            <= set(drawn["traces"]), drawn
        most_accurate = max(trials.values(), key=lambda t: t["value"])
        front = {int(n) for n in drawn["front"].split(",")}
        assert {best_within["number"], most_accurate["number"]} <= front, (drawn, trials)

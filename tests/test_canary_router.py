"""The gradual release in front of TensorFlow Serving (issue 27, Kubernetes): ``tunehub model
serve NAME --upstream URL`` forwards the production route to the upstream's ``stable`` label and
the canary's share to the canary, judges the canary's answers with the same rules as the local
mode, and moves it in the registry, whose ``models.config`` the labels follow.

No TensorFlow Serving binary exists here: the upstream is a real ``tunehub model serve`` (local
mode, which answers TensorFlow Serving's label and version routes and, like TensorFlow Serving,
a failed assertion in the graph with a 400), the router a second real process in front of it.
Each version multiplies by its own factor, so every answer says which version gave it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import test_canary_release
from tests.conftest import Home
from tests.polling import wait_for
from tests.serving_helpers import served
from tests.test_canary_release import _register

pytestmark = pytest.mark.slow

#: A real ``tunehub model serve doubler`` with given flags (the canary tests' fixture).
serve = test_canary_release.serve

# Each version multiplies its input by its factor; one fails on inputs of 5 and more, as a
# model with a bug on some inputs does (tf.debugging: an InvalidArgumentError in the graph).
SAVE = """
import json, sys
import tensorflow as tf

def module(factor, fail_above):
    class Scaler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def serve(self, x):
            if fail_above is not None:
                tf.debugging.assert_less(x, fail_above, message="input out of range")
            return {"y": x * factor}
    return Scaler()

for path, factor, fail_above in json.loads(sys.argv[1]):
    m = module(factor, fail_above)
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})
"""

MODELS = {"times2": (2.0, None), "times3": (3.0, None), "times4-fails": (4.0, 5.0)}


@pytest.fixture(scope="module")
def scalers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scalers")
    paths = {name: root / name for name in MODELS}
    spec = [[str(paths[n]), f, above] for n, (f, above) in MODELS.items()]
    proc = subprocess.run([sys.executable, "-c", SAVE, json.dumps(spec)], text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return paths


def _ask(url: str, value: float) -> httpx.Response:
    return httpx.post(f"{url}:predict", json={"instances": [[value] * 4]}, timeout=120)


def _answer(url: str, value: float) -> float:
    """The one number every position of the answer holds (input x the version's factor)."""
    r = _ask(url, value)
    assert r.status_code == 200, r.text
    row = r.json()["predictions"][0]
    assert len(set(row)) == 1, row
    return float(row[0])


def _versions(home: Home) -> dict[int, dict[str, Any]]:
    shown = home.cli("model", "show", "doubler", "--json", check=True).stdout
    return {v["version"]: v for v in json.loads(shown)}


def _counted(base: str) -> dict[tuple[str, str], float]:
    """The router's own predict counter: (version or label it went to, status) -> count."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tunehub_serving_requests_total":
                out[(sample.labels["version"], sample.labels["code"])] = sample.value
    return out


def _labels(home: Home) -> dict[str, int]:
    """The ``stable``/``canary`` labels TensorFlow Serving reads from the registry's config."""
    return served(home.path / "data" / "models" / "models.config")["doubler"]["labels"]


def test_the_router_splits_rolls_forward_and_rolls_back_in_front_of_tf_serving(
    sqlite_home: Home, scalers: dict[str, Path], serve: Callable[..., str],
) -> None:
    v1 = _register(sqlite_home, scalers["times2"], "production")
    v2 = _register(sqlite_home, scalers["times3"], "canary")
    assert _labels(sqlite_home) == {"stable": v1, "canary": v2}
    upstream = serve()  # stands in for TensorFlow Serving: no release of its own
    tf_serving = upstream.removesuffix("/v1/models/doubler")
    router = serve("--upstream", tf_serving, "--canary-share", "0.25", "--canary-requests", "5")
    router_base = router.removesuffix("/v1/models/doubler")

    # The share: every fourth request of the production route goes to the canary (v2, x3), the
    # others to the stable label (v1, x2). The fifth clean canary answer (request 20) moves it.
    answers = [_answer(router, 1.0) for _ in range(20)]
    assert answers == [3.0 if i % 4 == 3 else 2.0 for i in range(20)], answers
    counted = _counted(router_base)
    assert counted[(str(v2), "200")] == 5 and counted[("stable", "200")] == 15, counted

    versions = _versions(sqlite_home)
    assert (versions[v1]["stage"], versions[v2]["stage"]) == ("archived", "production")
    assert versions[v2]["history"][-1]["reason"] == (
        "canary v2: 5 requests answered, 0 errors (at most 0 allowed): rolled forward")
    assert versions[v1]["history"][-1]["reason"].startswith("v2 took production: canary v2")
    # The registry rewrote TensorFlow Serving's config: the labels follow, no canary left...
    assert _labels(sqlite_home) == {"stable": v2}
    # ...and the upstream answers the stable label from v2 once it re-reads its stages.
    wait_for(lambda: _answer(f"{router}/labels/stable", 1.0) == 3.0, timeout=60,
             what="the upstream's stable label to follow the roll-forward")

    # A canary that fails on inputs of 5 and more (v3, x4). A fresh router (its counter from 0),
    # half the production route to the canary, three clean answers to move it.
    v3 = _register(sqlite_home, scalers["times4-fails"], "canary")
    assert _labels(sqlite_home) == {"stable": v2, "canary": v3}
    router = serve("--upstream", tf_serving, "--canary-share", "0.5", "--canary-requests", "3")
    assert _answer(router, 1.0) == 3.0    # 1: stable
    assert _answer(router, 1.0) == 4.0    # 2: the canary, clean
    assert _answer(router, 1.0) == 3.0    # 3: stable
    # 4: the canary; a request the upstream refuses whatever answers it (the wrong shape): the
    # client gets production's 400, and it is not the canary's error.
    bad = httpx.post(f"{router}:predict", json={"instances": [[1.0, 2.0]]}, timeout=120)
    assert bad.status_code == 400 and "shape" in bad.json()["error"], bad.text
    assert _versions(sqlite_home)[v3]["stage"] == "canary"
    assert _answer(router, 9.0) == 27.0   # 5: stable
    # 6: the canary fails where production answers: the client gets production's answer,
    # and the canary is rolled back at once, saying what failed.
    assert _answer(router, 9.0) == 27.0
    versions = _versions(sqlite_home)
    assert (versions[v2]["stage"], versions[v3]["stage"]) == ("production", "archived")
    reason = versions[v3]["history"][-1]["reason"]
    assert reason.startswith("canary v3 rolled back: 1 errors in 2 requests; last: HTTP 400: "
                             "InvalidArgumentError: "), reason
    assert "input out of range" in reason
    assert versions[v2]["history"][-1]["stage"] == "production"  # production never moved
    assert _labels(sqlite_home) == {"stable": v2}
    # No canary now: every request of the production route is production's.
    assert [_answer(router, 1.0) for _ in range(4)] == [3.0] * 4


def test_bad_upstream_urls_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.cli import build_parser

    for value in ("tunehub-serving:8501", "ftp://serving", "http://serving:port",
                  "http://serving:8501/?x=1"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["model", "serve", "digits", "--upstream", value])
        said = capsys.readouterr().err
        assert exit_.value.code == 2 and "--upstream" in said and value in said, said
    args = build_parser().parse_args(["model", "serve", "digits", "--upstream",
                                      "http://tunehub-serving:8501/"])
    assert args.upstream == "http://tunehub-serving:8501"

"""The measuring pod's one line of result, as the tuner reads it (:mod:`tuner.serving.cost_report`):
taken only when there is exactly one, with exactly the three figures as finite numbers; the
pod's own error is the reason; anything else is refused with why."""

from __future__ import annotations

import json

import pytest

from tuner.serving.cost import CostError, CostMethod
from tuner.serving.cost_report import LOG_BYTES, PREFIX, method_args, parse_report

FIGURES = {"model_size_mb": 0.05, "serving_latency_p50_ms": 1.2, "serving_latency_p95_ms": 2.5}


def line(obj: object) -> str:
    return PREFIX + json.dumps(obj) + "\n"


def test_one_line_of_figures_is_taken() -> None:
    assert parse_report("warning: something\n" + line(FIGURES)) == FIGURES


def test_the_pods_error_is_the_reason() -> None:
    with pytest.raises(CostError, match="^the model cannot be served: no signature$"):
        parse_report(line({"error": "the model cannot be served: no signature"}))


@pytest.mark.parametrize(("text", "why"), [
    ("", "0 result lines"),
    (line(FIGURES) * 2, "2 result lines"),
    (PREFIX + "{not json\n", "not JSON"),
    (line({**FIGURES, "extra": 1}), "does not name exactly"),
    (line({k: v for k, v in FIGURES.items() if k != "model_size_mb"}), "does not name exactly"),
    (line({**FIGURES, "model_size_mb": "1"}), "model_size_mb is not a finite number"),
    (line({**FIGURES, "serving_latency_p95_ms": -1}), "not a finite number"),
    (line({**FIGURES, "serving_latency_p50_ms": True}), "not a finite number"),
    (PREFIX + json.dumps(FIGURES).replace("2.5", "NaN") + "\n", "not a finite number"),
    ("x" * LOG_BYTES + line(FIGURES), "over 64 KiB"),
])
def test_anything_else_is_refused_with_why(text: str, why: str) -> None:
    with pytest.raises(CostError, match=why):
        parse_report(text)


def test_the_method_travels_whole_to_the_pod(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """What the tuner puts on the pod's command line is the method the pod measures with,
    and what the pod prints is what the tuner takes."""
    import tuner.serving.cost as cost
    from tuner.serving import cost_report

    method = CostMethod(batch_size=8, concurrency=2, warmup=3, requests=40, cpus=1)
    seen: dict[str, CostMethod] = {}

    def fake_measure(model_dir: object, process: object, got: CostMethod) -> dict[str, float]:
        seen["method"] = got
        return FIGURES

    monkeypatch.setattr(cost, "measure", fake_measure)
    assert cost_report.main(["/nonexistent", *method_args(method)]) == 0
    assert seen["method"] == method
    assert parse_report(capsys.readouterr().out) == FIGURES

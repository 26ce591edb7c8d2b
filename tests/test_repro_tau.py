"""A trained predictor's Kendall tau is undefined (None in learn/predictor.py's figures) when it gives
every request of the evaluated trace the same length: the reproductions that train one say so in their
arms' labels and verdicts ("tau undefined") instead of stopping on ``float(None)``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightgbm", reason="the `learn` extra (in `test`) installs LightGBM")

from llmlb_bench.learn import predictor as learn_predictor  # noqa: E402
from llmlb_bench.repro import intelligent_router, sjf  # noqa: E402


@pytest.fixture
def constant_prediction(monkeypatch):
    """The trained predictors' figures on the evaluated trace as a constant prediction has them."""
    real = learn_predictor.evaluate_trace
    monkeypatch.setattr(learn_predictor, "evaluate_trace",
                        lambda predictor, table, window=32: {**real(predictor, table, window), "kendall_tau": None})


def test_sjf_labels_and_verdict_say_the_tau_is_undefined(constant_prediction):
    arms = sjf.arms("small")
    trained = [a.label for a in arms if a.label.startswith("sjf trained")]
    assert trained == ["sjf trained regression tau=undefined", "sjf trained rank tau=undefined"]
    run = lambda e2e: {"e2e": {"mean": e2e}}  # noqa: E731
    verdict = sjf.check({"fcfs": run(10.0), "sjf tau=0": run(10.0), "sjf tau=0.9": run(5.0),
                         **{label: run(9.9) for label in trained}})
    assert "rank 9.9 s (held-out tau undefined," in verdict.evidence and not verdict.passed


def test_intelligent_router_labels_the_predictor_arm_with_an_undefined_tau(constant_prediction, monkeypatch):
    from llmlb_bench.learn import train

    monkeypatch.setattr(train, "train_policy", lambda *a, **k: ({"stand-in": "policy"}, None))  # not what is tested
    arms = {a.label: a for a in intelligent_router.arms("small")}
    assert Path(str(arms["least_predicted_work (tau undefined)"].args["predictor"])).is_file()

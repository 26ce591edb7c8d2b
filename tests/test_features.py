"""The shared observation features (policies/features.py) on hand-built Views: every field's
value against the raw signal and the documented scaling, the layout's round trip and its refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.policies import RouteRequest, TargetInfo, View
from llmlb_bench.policies.features import (FIELD_SOURCES, PER_REQUEST, PER_TARGET, Features, unavailable)
from llmlb_bench.policies.lora import AdapterSnapshot
from llmlb_bench.policies.base import set_cached_prefix


def _view() -> View:
    return View(targets=[TargetInfo("r0", capacity=1.0), TargetInfo("r1", capacity=2.0), TargetInfo("r2")],
                now=10.0, outstanding_requests=[0, 4, 1], outstanding_tokens=[0, 3000, 999],
                waiting=[0, 3, 1], running=[2, 8, 0], kv_usage=[0.1, 0.9, 0.0], healthy=[True, False, True],
                signal_time=[10.0, 9.5, 8.0],
                adapters=[AdapterSnapshot(4, frozenset({"a"}), frozenset()),
                          AdapterSnapshot(2, frozenset({"b"}), frozenset({"a"})), None])


def _req(**kw: object) -> RouteRequest:
    args: dict = dict(request_id=1, arrival_s=10.0, input_tokens=2000, max_output_tokens=500,
                      prefix_hashes=(11, 12, 13, 14))
    args.update(kw)
    return RouteRequest(**args)


def _col(f: Features, x: np.ndarray, name: str) -> np.ndarray:
    return x[:, f.target_names.index(name)]


def test_default_fields_and_values_follow_the_documented_scaling():
    view = _view()
    f = Features(view)
    assert f.target_names == PER_TARGET
    assert f.request_names == tuple(n for n in PER_REQUEST if n != "predicted_output")
    x = f.targets(_req(adapter="a"), view)
    assert x.dtype == np.float32 and x.shape == (3, len(PER_TARGET))
    np.testing.assert_allclose(_col(f, x, "waiting"), np.log1p([0, 3, 1]), rtol=1e-6)
    np.testing.assert_allclose(_col(f, x, "running"), np.log1p([2, 8, 0]), rtol=1e-6)
    np.testing.assert_allclose(_col(f, x, "outstanding_requests"), np.log1p([0, 4, 1]), rtol=1e-6)
    np.testing.assert_allclose(_col(f, x, "outstanding_tokens"), np.log1p([0, 3.0, 0.999]), rtol=1e-6)
    np.testing.assert_allclose(_col(f, x, "kv_usage"), [0.1, 0.9, 0.0], rtol=1e-6)
    np.testing.assert_allclose(_col(f, x, "signal_age_s"), [0.0, 0.5, 2.0], rtol=1e-6)
    np.testing.assert_array_equal(_col(f, x, "healthy"), [1, 0, 1])
    np.testing.assert_array_equal(_col(f, x, "capacity"), [1, 2, 1])
    # adapter "a": running on r0, queued on r1, r2 publishes nothing
    np.testing.assert_array_equal(_col(f, x, "adapter_resident"), [1.0, 0.5, 0.0])
    # r0: 4 slots, 1 taken; r1: 2 slots, {b} running + {a} waiting = full
    np.testing.assert_allclose(_col(f, x, "adapter_slots_free"), [0.75, 0.0, 0.0])
    # nothing routed yet: the own prefix index holds nothing
    np.testing.assert_array_equal(_col(f, x, "prefix_match"), [0, 0, 0])
    r = f.request(_req(adapter="a", session_id=7, priority=2, turn=3))
    assert r.dtype == np.float32
    got = dict(zip(f.request_names, r.tolist()))
    assert got == pytest.approx({"input_tokens": math.log1p(2.0), "max_output_tokens": math.log1p(0.5),
                                 "prefix_blocks": math.log1p(4), "priority": 2.0, "in_session": 1.0,
                                 "turn": math.log1p(3), "has_adapter": 1.0}, rel=1e-6)


def test_base_model_request_scores_no_adapter_and_no_session():
    view = _view()
    f = Features(view)
    x = f.targets(_req(), view)
    np.testing.assert_array_equal(_col(f, x, "adapter_resident"), [0, 0, 0])
    got = dict(zip(f.request_names, f.request(_req(prefix_hashes=())).tolist()))
    assert got["in_session"] == 0 and got["has_adapter"] == 0 and got["prefix_blocks"] == 0 and got["turn"] == 0


def test_prefix_match_from_the_own_index_after_record():
    view = _view()
    f = Features(view)
    f.record(_req(prefix_hashes=(11, 12)), 1, 1.0)          # r1 saw the first two blocks
    f.record(_req(prefix_hashes=(11, 12, 13, 14, 15)), 2, 2.0)  # r2 saw all four and more
    x = f.targets(_req(), view)
    np.testing.assert_allclose(_col(f, x, "prefix_match"), [0.0, 0.5, 1.0])
    # a prompt that shares nothing
    np.testing.assert_array_equal(_col(f, f.targets(_req(prefix_hashes=(99,)), view), "prefix_match"), [0, 0, 0])


def test_prefix_match_from_kv_events_when_the_view_has_them():
    view = _view()
    set_cached_prefix(view, lambda i, hashes: [1, 0, 3][i])
    f = Features(view)
    f.record(_req(), 1, 1.0)        # the own index would say r1 holds all four; events win under "auto"
    np.testing.assert_allclose(_col(f, f.targets(_req(), view), "prefix_match"), [0.25, 0.0, 0.75])
    own = Features(view, prefix_source="index")
    own.record(_req(), 1, 1.0)
    np.testing.assert_allclose(_col(own, own.targets(_req(), view), "prefix_match"), [0.0, 1.0, 0.0])


def test_events_only_prefix_source_is_refused_without_events():
    with pytest.raises(UserError, match="publishes none"):
        Features(_view(), prefix_source="events")
    with pytest.raises(UserError, match="unknown prefix source"):
        Features(_view(), prefix_source="magic")


def test_field_selection_keeps_layout_order():
    view = _view()
    f = Features(view, fields=["healthy", "input_tokens", "waiting"])
    assert f.target_names == ("waiting", "healthy")
    assert f.request_names == ("input_tokens",)
    x = f.targets(_req(), view)
    np.testing.assert_allclose(x, np.array([[0, 1], [math.log1p(3), 0], [math.log1p(1), 1]]), rtol=1e-6)


class _Half:
    def predict(self, req: RouteRequest) -> float:
        return req.max_output_tokens / 2


def test_predicted_output_needs_a_predictor_and_uses_it():
    with pytest.raises(UserError, match="needs a length predictor"):
        Features(_view(), fields=["predicted_output"])
    f = Features(_view(), predictor=_Half())
    assert f.request_names[-1] == "predicted_output"
    assert f.request(_req())[-1] == pytest.approx(math.log1p(0.25))


def test_slo_class_indicators():
    f = Features(_view(), slo_classes=["interactive", "batch"])
    assert f.request_names[-2:] == ("slo_class=interactive", "slo_class=batch")
    assert f.request(_req(slo_class="batch"))[-2:].tolist() == [0.0, 1.0]
    assert f.request(_req(slo_class="other"))[-2:].tolist() == [0.0, 0.0]
    with pytest.raises(UserError, match="twice"):
        Features(_view(), slo_classes=["a", "a"])


def test_kind_indicators_follow_the_class_indicators():
    f = Features(_view(), slo_classes=["batch"], kinds=["code", "rag"])
    assert f.request_names[-3:] == ("slo_class=batch", "kind=code", "kind=rag")
    assert f.request(_req(slo_class="batch", kind="rag"))[-3:].tolist() == [1.0, 0.0, 1.0]
    g = Features.from_layout(json.loads(json.dumps(f.layout())), _view())
    assert g.request_names == f.request_names
    with pytest.raises(UserError, match="twice"):
        Features(_view(), kinds=["code", "code"])


def test_unknown_field_is_one_line():
    with pytest.raises(UserError, match="unknown feature 'queue'"):
        Features(_view(), fields=["queue"])


def test_layout_round_trips_through_json_and_refuses_changes():
    view = _view()
    f = Features(view, predictor=_Half(), slo_classes=["batch"], prefix_source="index")
    stored = json.loads(json.dumps(f.layout()))
    g = Features.from_layout(stored, view, predictor=_Half(), where="p.json")
    assert g.layout() == f.layout()
    req = _req(slo_class="batch")
    np.testing.assert_array_equal(g.targets(req, view), f.targets(req, view))
    np.testing.assert_array_equal(g.request(req), f.request(req))
    changed = json.loads(json.dumps(stored))
    changed["per_target"][0]["scale"] = 2.0
    with pytest.raises(UserError, match="^p.json: feature layout differs"):
        Features.from_layout(changed, view, predictor=_Half(), where="p.json")
    with pytest.raises(UserError, match="version 99"):
        Features.from_layout(dict(stored, version=99), view, where="p.json")
    with pytest.raises(UserError, match="not a feature layout"):
        Features.from_layout({"format": "other"}, view, where="p.json")
    with pytest.raises(UserError, match="needs a length predictor"):
        Features.from_layout(stored, view, where="p.json")
    reordered = json.loads(json.dumps(stored))
    reordered["per_target"] = reordered["per_target"][::-1]
    with pytest.raises(UserError, match="differs"):
        Features.from_layout(reordered, view, predictor=_Half(), where="p.json")


def test_unavailable_names_fields_a_backend_cannot_fill():
    assert set(FIELD_SOURCES) == set(PER_TARGET) | set(PER_REQUEST)
    assert unavailable(PER_TARGET, set()) == ["waiting", "running", "kv_usage", "adapter_resident",
                                              "adapter_slots_free", "signal_age_s"]
    assert unavailable(PER_TARGET, {"scraped", "adapters"}) == []
    assert unavailable(["input_tokens", "predicted_output"], set()) == ["predicted_output"]

"""Trained output-length predictors: fitting (LightGBM, the `learn` extra), the plain-JSON file,
its numpy evaluation (equal to LightGBM's on the same rows), the held-out figures, the file's
checks, and the predictive policies and the engine's SJF scheduler running on a predictor."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.learn import predictor as lp
from llmlb_bench.policies import make_policy
from llmlb_bench.policies.predictor import Predictor, load_predictor
from llmlb_bench.schema import write_trace
from llmlb_bench.sim import ClusterConfig
from sim_helpers import run_sim, trace

lightgbm = pytest.importorskip("lightgbm", reason="the `learn` extra (in `test`) installs LightGBM")


def mixed(n: int = 3000, seed: int = 0, informative: bool = True) -> pa.Table:
    """Tenants, classes, kinds, adapters and conversations; with ``informative`` the output
    length depends on the tenant, the prompt and the turn (with noise), else on nothing."""
    rng = np.random.default_rng(seed)
    tenant = rng.choice(["chat", "code", "batch", "agent"], n)
    inp = rng.lognormal(6.0, 0.9, n).clip(8, 8000).astype(np.int32)
    session = rng.integers(0, n // 4, n)
    turn = rng.integers(0, 6, n).astype(object)
    turn[rng.random(n) < 0.3] = None                            # outside conversations: NaN
    base = {"chat": 200.0, "code": 40.0, "batch": 600.0, "agent": 120.0}
    if informative:
        mean = np.array([base[t] for t in tenant]) * (inp / 400.0) ** 0.5 * (1 + 0.2 * np.nan_to_num(
            np.array([np.nan if t is None else t for t in turn], dtype=float)))
        out = (mean * rng.lognormal(0, 0.3, n)).clip(1, 4000).astype(np.int32)
    else:
        out = rng.lognormal(5.0, 1.0, n).clip(1, 4000).astype(np.int32)
    adapter = np.where(rng.random(n) < 0.5, None, rng.choice(["lora-a", "lora-b"], n))
    session_col = np.where(np.array([t is None for t in turn]), None, session)
    return trace(np.sort(rng.uniform(0, 600, n)), inp, out,
                 tenant=pa.array(tenant).dictionary_encode(),
                 slo_class=pa.array(np.where(tenant == "code", "tight", "loose")).dictionary_encode(),
                 kind=pa.array(np.where(tenant == "agent", "agent", "chat")).dictionary_encode(),
                 adapter=pa.array(adapter.tolist(), pa.string()).dictionary_encode(),
                 session_id=pa.array(session_col.tolist(), pa.int64()),
                 turn=pa.array(turn.tolist(), pa.int32()),
                 priority=pa.array(rng.integers(0, 3, n).astype(np.int8)))


@pytest.fixture(scope="module")
def fitted() -> dict[str, dict]:
    table = mixed()
    return {obj: lp.fit(table, objective=obj, trees=40) for obj in ("regression", "rank")}


@pytest.mark.parametrize("objective", ["regression", "rank"])
def test_numpy_trees_equal_lightgbm_on_the_same_rows(objective):
    # fit LightGBM directly on the encoded rows, export, and compare raw scores row by row,
    # including rows LightGBM never saw: unseen categories (-1) and missing turns (NaN)
    table = mixed(1500, seed=3)
    reqs, y, _, key = lp.requests_of(table)
    specs, x = lp._columns(reqs, np.ones(len(reqs), dtype=bool))
    cat = [i for i, s in enumerate(specs) if "categories" in s]
    params = {"num_leaves": 15, "verbose": -1, "deterministic": True, "num_threads": 1, "seed": 1,
              "min_data_per_group": 5, "max_cat_to_onehot": 2}
    if objective == "regression":
        data = lightgbm.Dataset(x, label=np.log1p(y), categorical_feature=cat)
        params["objective"] = "regression"
    else:
        data = lightgbm.Dataset(x, label=(y < np.median(y)).astype(float), group=lp._windows(len(y), 32),
                                categorical_feature=cat)
        params["objective"] = "lambdarank"
    booster = lightgbm.train(params, data, num_boost_round=30)
    doc = {"format": "llmlb-predictor", "version": 1, "objective": "regression", "features": specs,
           "trees": [lp._tree_arrays(t["tree_structure"]) for t in booster.dump_model()["tree_info"]],
           "output": {"min_tokens": 1.0, "max_tokens": 4000.0}}
    assert any(c is not None for t in doc["trees"] for c in t["categories"]), "no categorical split exercised"
    probe = x.copy()
    probe[::7, cat[0]] = -1.0                       # a tenant unseen in training
    turn = [s["name"] for s in specs].index("turn")
    probe[::5, turn] = np.nan
    probe[::11, turn] = 0.0
    ours = Predictor(json.loads(json.dumps(doc)), "t").scores(probe)
    theirs = booster.predict(probe, raw_score=True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)


def test_a_learnable_length_is_ranked_and_a_random_one_is_not(fitted):
    reg = fitted["regression"]["heldout"]
    # the noise alone (lognormal sigma 0.3 around a function of the features) bounds tau well above 0.5
    assert reg["kendall_tau"] > 0.6 and reg["window_tau"] > 0.5
    assert reg["mae_tokens"] < 0.6 * reg["median_mae_tokens"]
    assert fitted["rank"]["heldout"]["kendall_tau"] > 0.6
    noise = lp.fit(mixed(informative=False), trees=40)["heldout"]
    assert abs(noise["kendall_tau"]) < 0.1


def test_heldout_rows_are_whole_conversations_and_never_seen_in_fitting():
    table = mixed(2000, seed=5)
    reqs, y, _, key = lp.requests_of(table)
    test = lp.heldout_mask(key, 0.2, seed=0)
    assert 0.1 < test.mean() < 0.3
    sessions = {}
    for r, t in zip(reqs, test):
        if r.session_id is not None:
            sessions.setdefault(r.session_id, set()).add(bool(t))
    assert all(len(sides) == 1 for sides in sessions.values())
    # changing held-out rows' outputs changes nothing that was fitted
    out = table.column("output_tokens").to_numpy().copy()
    out[test] = 1
    changed = table.set_column(table.schema.get_field_index("output_tokens"), "output_tokens",
                               pa.array(out, pa.int32()))
    a, b = lp.fit(table, trees=10), lp.fit(changed, trees=10)
    assert a["trees"] == b["trees"] and a["heldout"] != b["heldout"]


def test_fitting_is_deterministic_and_the_file_is_plain_json(fitted, tmp_path):
    again = lp.fit(mixed(), objective="rank", trees=40)
    assert json.dumps(again) == json.dumps(fitted["rank"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(fitted["rank"]))
    p = load_predictor(path)
    assert p.objective == "rank" and "tenant" in p.feature_names and "turn" in p.feature_names


def test_rank_scores_become_tokens_in_the_same_order(fitted):
    p = Predictor(fitted["rank"], "r")
    reqs, *_ = lp.requests_of(mixed(400, seed=9))
    x = p.encode_many(reqs)
    s, tok = p.scores(x), p.predict_many(reqs)
    order = np.argsort(-s, kind="stable")             # higher score = shorter
    assert np.all(np.diff(tok[order]) >= 0)
    assert tok.min() >= 1 and [p.predict(r) for r in reqs[:20]] == pytest.approx(tok[:20].tolist())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="other"), "not an llmlb predictor"),
    (lambda d: d.update(version=7), "version 7 is not supported"),
    (lambda d: d.update(objective="classify"), "unknown objective 'classify'"),
    (lambda d: d["features"].append({"name": "max_output_tokens"}), "unknown feature 'max_output_tokens'"),
    (lambda d: d["trees"][0]["left"].__setitem__(0, 0), "children must follow it"),
    (lambda d: d["trees"][0]["value"].pop(), "must be a list of"),
    (lambda d: d["trees"][0]["feature"].__setitem__(0, 99), "splits on feature 99"),
    (lambda d: d["output"].update(score=[1.0, 0.5], tokens=[1.0, 2.0]), "strictly increasing"),
])
def test_a_bad_predictor_file_is_one_line_naming_the_file(fitted, tmp_path, edit, message):
    doc = json.loads(json.dumps(fitted["rank"]))
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=message) as err:
        Predictor.load(path)
    assert err.value.where == str(path) and "\n" not in err.value.line()


@pytest.mark.slow
def test_cli_fits_reports_and_refuses_bad_input_in_one_line(tmp_path):
    src = tmp_path / "t.parquet"
    write_trace(mixed(800), src)
    out = tmp_path / "p.json"
    run = subprocess.run([sys.executable, "-m", "llmlb_bench", "learn", "predictor", str(src), "-o", str(out),
                          "--trees", "10"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "Kendall tau" in run.stdout and json.loads(out.read_text())["training"]["rows"] == 800
    flat = tmp_path / "flat.parquet"
    write_trace(trace(np.arange(100) * 0.1, 200, np.arange(100) + 1), flat)
    bad = subprocess.run([sys.executable, "-m", "llmlb_bench", "learn", "predictor", str(flat), "-o",
                          str(tmp_path / "x.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith(f"error: {flat}: nothing known at arrival varies")
    assert bad.stderr.count("\n") == 1 and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("kw, where", [({"objective": "knn"}, "--objective"), ({"heldout": 1.0}, "--heldout"),
                                       ({"trees": 1}, "--trees")])
def test_bad_fitting_options_are_refused_before_fitting(kw, where):
    with pytest.raises(UserError) as err:
        lp.fit(mixed(100), **kw)
    assert err.value.where == where


@pytest.fixture(scope="module")
def exact_file(tmp_path_factory) -> str:
    """A predictor of output = 2 x prompt (exactly learnable from the prompt length)."""
    rng = np.random.default_rng(0)
    inp = rng.integers(10, 500, 2000)
    path = tmp_path_factory.mktemp("exact") / "exact.json"
    path.write_text(json.dumps(lp.fit(trace(np.arange(2000) * 0.01, inp, 2 * inp), trees=60)))
    return str(path)


def test_predicted_sjf_and_least_predicted_work_read_the_predictor_not_the_length(exact_file):
    from llmlb_bench.policies import RouteRequest, TargetInfo, View
    from test_policies_slo import Backend

    b = Backend(make_policy("predicted_sjf", {"max_outstanding": 1, "predictor": exact_file}))
    prompts = [100, 450, 15, 250, 40]
    for i, p in enumerate(prompts):       # max_output_tokens says the opposite order: never read
        b.arrive(RouteRequest(i, 0.01 * i, p, 1000 - p))
    for t, rid in enumerate([0, 2, 4, 3]):
        b.finish(rid, 1.0 + t)
    assert [rid for rid, _ in b.sent] == [0, 2, 4, 3, 1]

    pol = make_policy("least_predicted_work", {"predictor": exact_file})
    v = View([TargetInfo("a"), TargetInfo("b")])
    big = RouteRequest(0, 0.0, 400, 1)
    first = pol.choose(big, v)
    assert pol._work[first] == pytest.approx(800, rel=0.1)
    assert [pol.choose(RouteRequest(i, 0.0, 50, 5000), v) for i in range(1, 8)] == [1 - first] * 7


def test_engine_sjf_serves_by_the_predictor(tmp_path, exact_file):
    # one seat: request 0 takes it, the rest queue; the predictor orders them by prompt
    prompts = [100, 450, 15, 250, 40]
    table = trace(np.arange(5) * 0.001, prompts, 50)
    req = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=1, scheduler="sjf",
                                                       scheduler_args={"predictor": exact_file, "aging": 0.0}))[0]
    order = [r["request_id"] for r in sorted(req.to_pylist(), key=lambda r: r["first_token_s"])]
    assert order == [0, 2, 4, 3, 1]


def test_a_missing_predictor_file_stops_the_run_before_it_starts(tmp_path):
    with pytest.raises(UserError, match="predictor file not found"):
        make_policy("predicted_sjf", {"predictor": str(tmp_path / "none.json")})
    with pytest.raises(UserError, match="predictor file not found"):
        ClusterConfig.build(replicas=1, scheduler="sjf", scheduler_args={"predictor": str(tmp_path / "none.json")})


def test_a_learned_policy_trained_with_predicted_output_needs_and_uses_the_predictor(tmp_path, exact_file):
    # a two-replica run trained for one generation with the predictor's feature: the file records
    # the predictor, runs with it, and is refused without it (one line, before any request)
    from llmlb_bench.learn.train import train_policy, write_policy
    from llmlb_bench.policies.predictor import Predictor

    rng = np.random.default_rng(1)
    inp = rng.integers(10, 400, 120)
    table = trace(np.sort(rng.uniform(0, 20, 120)), inp, 2 * inp)
    fields = ["outstanding_requests", "outstanding_tokens", "input_tokens", "predicted_output"]
    doc, _ = train_policy([table], ClusterConfig.build(replicas=2), objective="neg_latency", slo=None,
                          identity={"rows": 120}, seed=0, hidden=(3,), fields=fields, generations=1,
                          population=2, elite=1, predictor=exact_file)
    assert doc["training"]["predictor"]["file"] == "exact.json"
    assert "predicted_output" in [f["name"] for f in doc["features"]["per_request"]]
    path = tmp_path / "pol.json"
    write_policy(doc, path)
    pol = make_policy("learned", {"path": str(path), "predictor": exact_file})
    from llmlb_bench.policies import RouteRequest, TargetInfo, View
    v = View([TargetInfo("a"), TargetInfo("b")])
    assert pol.choose(RouteRequest(0, 0.0, 100, 1), v) in (0, 1)
    assert pol.features(v).request(RouteRequest(1, 0.0, 100, 1))[-1] == pytest.approx(
        np.log1p(Predictor.load(exact_file).predict(RouteRequest(1, 0.0, 100, 1)) / 1000.0), rel=1e-5)
    with pytest.raises(UserError, match="predicted_output.*needs a length predictor") as err:
        make_policy("learned", {"path": str(path)})
    assert err.value.where == str(path)


@pytest.mark.slow
def test_predicted_sjf_with_a_predictor_orders_a_real_replay(tmp_path, exact_file):
    # the replayer's Router with one no-op server (1 s to first token) and max_outstanding 1:
    # request 0 goes at once, the rest wait at the router and leave shortest *predicted* first;
    # every max_tokens is 2, so only the predictor (2 x prompt) can order them
    from replay_helpers import ServerThread, run_replay

    from llmlb_bench.replay.noop_server import NoopConfig

    st = ServerThread()
    try:
        url, _ = st.noop(NoopConfig(ttft_s=1.0))
        table = trace(np.arange(5) * 0.01, [100, 450, 15, 250, 40], 2)
        pol = make_policy("predicted_sjf", {"max_outstanding": 1, "predictor": exact_file})
        _, rows, _ = run_replay(table, [url], tmp_path, pol)
    finally:
        st.close()
    assert [r["request_id"] for r in sorted(rows, key=lambda r: r["sent_s"])] == [0, 2, 4, 3, 1]

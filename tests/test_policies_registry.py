"""Every built-in policy: registered, described, constructible from CLI strings,
valid and deterministic on a stream of requests; the ``llmlb policies`` listing."""

from __future__ import annotations

import inspect
import json
import random

import pytest

from llmlb_bench.cli import main
from llmlb_bench.errors import UserError
from llmlb_bench.policies import BUILTIN, FAMILIES, HOLD, REJECT, RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.registry import parse_args
from llmlb_bench.policies.base import on_dispatch, on_finish, put, set_now
from sim_helpers import builtin_args


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_params_describe_the_constructor_exactly(name):
    cls = BUILTIN[name]
    assert cls.summary and len(cls.summary) <= 120
    sig = inspect.signature(cls.__init__)
    ctor = {k: p.default for k, p in sig.parameters.items() if k != "self"}
    assert ctor == {k: d for k, (d, _) in cls.params.items()}
    assert all(doc for _, doc in cls.params.values())


def test_families_partition_the_builtins():
    names = [c.name for classes in FAMILIES.values() for c in classes]
    assert len(names) == len(set(names)) == len(BUILTIN)


def test_policy_args_from_the_command_line_reach_the_constructor():
    pol = make_policy("cache_aware", parse_args(["cache_threshold=0.5", "balance_abs_threshold=32",
                                                 "balance_rel_threshold=1.1", "max_tree_size=4096"]))
    assert pol.describe() == {"name": "cache_aware", "cache_threshold": 0.5, "balance_abs_threshold": 32,
                              "balance_rel_threshold": 1.1, "eviction_interval_secs": 60.0, "max_tree_size": 4096}
    assert make_policy("llm_d", parse_args(["precise=true"])).precise is True
    assert make_policy("edf", parse_args(["deadlines=chat=1,batch=30"])).deadlines == "chat=1,batch=30"


def test_bad_policy_args_are_one_line_user_errors():
    with pytest.raises(UserError, match="expects int"):
        make_policy("power_of_d", {"d": "two"})
    with pytest.raises(UserError, match="no parameter 'dd'.*parameters: d, load, seed"):
        make_policy("power_of_d", {"dd": 3})
    with pytest.raises(UserError, match="load must be"):
        make_policy("power_of_d", {"load": "vibes"})


def test_the_run_seed_reaches_randomised_policies_unless_set_explicitly():
    assert make_policy("power_of_d", {}, seed=9).seed == 9
    assert make_policy("power_of_d", {"seed": 1}, seed=9).seed == 1
    assert make_policy("round_robin", {}, seed=9).describe() == {"name": "round_robin"}


def drive(policy, n_targets: int = 4, n_requests: int = 400, seed: int = 0) -> list[int]:
    """Feed a stream of requests with shared prefixes and random completions through
    ``policy`` as a backend would (including HOLD/release and REJECT); return its decisions."""
    rng = random.Random(seed)
    v = View([TargetInfo(f"r{i}", capacity=1.0 + (i % 2)) for i in range(n_targets)])
    inflight: list[tuple[RouteRequest, int]] = []
    decisions: list[int] = []

    def dispatch(r: RouteRequest, t: int) -> None:
        decisions.append(t)
        assert t == REJECT or 0 <= t < n_targets
        if t >= 0:
            on_dispatch(v, t, r)
            inflight.append((r, t))

    for i in range(n_requests):
        set_now(v, i * 0.05)
        doc = rng.randrange(5)
        hashes = [doc * 1000 + k for k in range(rng.randrange(1, 30))]
        r = RouteRequest(i, v.now, 16 * len(hashes), rng.randrange(1, 500), tenant=f"t{rng.randrange(3)}",
                         session_id=rng.randrange(20) if rng.random() < 0.5 else None, prefix_hashes=hashes,
                         slo_class=rng.choice(["default", "batch"]))
        for k in range(n_targets):
            put(v, "waiting", k, rng.randrange(10))
            put(v, "kv_usage", k, rng.random())
        t = policy.choose(r, v)
        if t == HOLD:
            decisions.append(HOLD)
        else:
            dispatch(r, t)
        while inflight and rng.random() < 0.6:
            done, target = inflight.pop(rng.randrange(len(inflight)))
            on_finish(v, target, done)
            policy.on_complete(done, target, v)
            while (item := policy.release(v)) is not None:
                dispatch(*item)
        if t == HOLD:
            while (item := policy.release(v)) is not None:
                dispatch(*item)
    return decisions


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_policy_makes_valid_reproducible_decisions(name, tmp_path):
    args = {"max_outstanding": 3} if "max_outstanding" in BUILTIN[name].params else builtin_args(name, tmp_path)
    first = drive(make_policy(name, args, seed=3))
    assert first == drive(make_policy(name, args, seed=3))
    assert len(set(first) - {REJECT, HOLD}) >= 2, "a policy that never spreads load is broken on this stream"


def test_llmlb_policies_lists_every_builtin_with_its_parameters(capsys):
    main(["policies", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in listed if p["family"] != "engine (--scheduler)"} == set(BUILTIN)
    engine = [p for p in listed if p["family"] == "engine (--scheduler)"]
    assert [p["name"] for p in engine] == ["fcfs", "priority", "sjf", "vtc", "deadline"]
    assert next(p for p in engine if p["name"] == "vtc")["params"]["output_weight"]["default"] == 2.0
    cache_aware = next(p for p in listed if p["name"] == "cache_aware")
    assert cache_aware["family"] == "kv/locality"
    assert cache_aware["params"]["balance_abs_threshold"]["default"] == 64


def test_llmlb_policies_table_and_unknown_name(capsys):
    main(["policies"])
    out = capsys.readouterr().out
    assert "power_of_d" in out and "heterogeneity" in out
    with pytest.raises(SystemExit) as info:
        main(["policies", "nope"])
    assert info.value.code == 2 and "unknown policy 'nope'" in capsys.readouterr().err


def test_args_per_policy_scopes_and_shares_parameters():
    from llmlb_bench.policies import args_per_policy

    got = args_per_policy(["random", "power_of_d"], {"d": 3, "random.seed": 5})
    assert got == {"random": {"seed": 5}, "power_of_d": {"d": 3}}
    with pytest.raises(UserError, match="no compared policy has a parameter 'dd'"):
        args_per_policy(["random", "power_of_d"], {"dd": 3})


def test_policy_from_an_installed_entry_point(tmp_path, monkeypatch):
    """A package that declares an entry point in group llmlb_bench.policies is found by name."""
    (tmp_path / "my_router.py").write_text(
        "from llmlb_bench.policies.routing import RoundRobin\n"
        "class Mine(RoundRobin):\n    name = 'mine'\n")
    dist = tmp_path / "my_router-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-router\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[llmlb_bench.policies]\nmine = my_router:Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = make_policy("mine")
    assert type(policy).__name__ == "Mine"

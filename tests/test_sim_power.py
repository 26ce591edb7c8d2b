"""The simulator's power model against published measurements (ML.ENERGY leaderboard v3.0), and
the green knobs (SM clock, power cap) of the cost model."""

from __future__ import annotations


import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import load_catalog
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.power_check import load_fits, load_measurements, simulate_cell

#: stated tolerance on steady-state power against the measured cells the floors were fitted to
#: (docs/simulator.md reports the errors: without the sequence overhead at most 6.3% on H100, 5.1% on
#: B200 with Llama 3 70B; with it, the default since 2026-12-02, 8.2% at one cell, 7.3% at the others)
POWER_TOLERANCE = 0.08
#: the cells the default terms (sequence overhead on) put outside POWER_TOLERANCE, published in
#: docs/simulator.md; held to it, so that a change which brings one back (or adds one) is noticed
OVER_POWER_TOLERANCE = {"llama-3-70b h100-sxm tp4 b32"}


def _cells(model: str, gpu: str, batches: tuple[int, ...]) -> list:
    return [c for c in load_measurements() if c.model == model and c.gpu == gpu and c.max_num_seqs in batches]


def test_measurements_file_reads_and_is_consistent():
    cells = load_measurements()
    assert len(cells) == 42
    for c in cells:
        # the source's own arithmetic: energy per token = power / throughput (steady state)
        assert c.energy_per_token_j == pytest.approx(c.avg_power_w / c.output_tokens_per_s, rel=0.05)
        # the histogram counts every request of the run (1024 x the sweep's repeats)
        assert sum(c.output_len_counts) == c.num_requests


@pytest.mark.parametrize("model, gpu, batches", [("llama-3-8b", "h100-sxm", (8, 64, 256)),
                                                  ("llama-3-70b", "h100-sxm", (16, 256)),
                                                  ("llama-3-70b", "b200", (32, 512))])
def test_power_within_tolerance_of_measurements(model, gpu, batches):
    for cell in _cells(model, gpu, batches):
        sim = simulate_cell(cell)
        assert abs(sim.avg_power_w / cell.avg_power_w - 1) <= POWER_TOLERANCE, cell.label
        # the steady state holds the measured batch
        assert sim.avg_batch_size == pytest.approx(cell.avg_batch_size, rel=0.02)


@pytest.mark.slow
def test_every_fitted_cell_within_tolerance():
    """All 33 fitted cells (B200 with Llama 3 8B is host-bound in the measurement: not fitted): with
    the power terms fitted without the sequence overhead, every one; with the default terms (overhead
    on, one floor and scale for both H100 models), every one but OVER_POWER_TOLERANCE."""
    without = load_fits(table="fit_without_overhead")
    for cell in load_measurements():
        if (cell.model, cell.gpu) == ("llama-3-8b", "b200"):
            continue
        assert abs(simulate_cell(cell, fit=without[cell.gpu]).power_error) <= POWER_TOLERANCE, cell.label
        assert (abs(simulate_cell(cell).power_error) <= POWER_TOLERANCE) is (cell.label not in OVER_POWER_TOLERANCE), \
            cell.label


def test_power_rises_with_batch_and_saturates_below_the_limit():
    """Measured: power grows with the batch (more tensor-core work) and flattens near the limit."""
    cat = load_catalog()
    c = CostModel(cat.model("llama-3-8b"), cat.gpu("h100-sxm"))
    powers = [c.run_step(b, b * 600.0, b * 600.0, b)[1] for b in (1, 8, 64, 256, 1024)]
    assert powers == sorted(powers)
    g = cat.gpu("h100-sxm")
    # a memory-bound decode step draws at least the floor's share of the dynamic range (of the busy time)
    assert powers[0] > g.idle_w + 0.5 * g.memory_power_fraction * (g.max_w - g.idle_w)
    prefill = c.run_step(8192, 8192 * 4096.5, 8192, 1)[1]
    assert powers[-1] < prefill <= g.max_w


def test_clock_slows_compute_bound_prefill_in_proportion_and_decode_little():
    cat = load_catalog()
    full = CostModel(cat.model("llama-3-8b"), cat.gpu("h100-sxm"))
    half = CostModel(cat.model("llama-3-8b"), cat.gpu("h100-sxm"), gpu_clock=0.5)
    big = (8192, 8192 * 4096.5, 8192, 1)
    t_full, p_full = full.run_step(*big)
    t_half, p_half = half.run_step(*big)
    # compute-bound: the tensor-core time doubles; the fixed terms (overhead, layers) do not scale
    compute = full.step(8192, 8192 * 4096.5, 8192, 0, 0, 1).compute_s
    assert t_half - t_full == pytest.approx(compute, rel=0.05)
    decode = (8, 8 * 600.0, 8 * 600.0, 8)
    assert half.run_step(*decode)[0] / full.run_step(*decode)[0] < 1.05       # memory-bound: < 5% slower
    g = cat.gpu("h100-sxm")
    # dynamic power: the clock-invariant share plus the rest as clock ** exponent, at equal activity
    # (prefill: activity ~ 1 at both clocks)
    f = g.clock_invariant_power
    assert (p_half - g.idle_w) / (p_full - g.idle_w) == pytest.approx(f + (1 - f) * 0.5 ** g.clock_power_exponent,
                                                                       rel=0.02)


def test_default_clock_is_bit_identical_and_set_clock_round_trips():
    cat = load_catalog()
    a = CostModel(cat.model("llama-3-70b"), cat.gpu("h100-sxm"), 4)
    b = CostModel(cat.model("llama-3-70b"), cat.gpu("h100-sxm"), 4, gpu_clock=0.6)
    b.set_clock(1.0)
    for args in ((1, 100.0, 100.0, 1), (300, 3e5, 3e5, 20), (8192, 3e7, 8192, 1)):
        assert a.run_step(*args) == b.run_step(*args)


def test_power_cap_bounds_power_and_slows_only_steps_above_it():
    cat = load_catalog()
    g = cat.gpu("h100-sxm")
    free = CostModel(cat.model("llama-3-8b"), g)
    prefill, decode = (8192, 8192 * 4096.5, 8192, 1), (1, 600.0, 600.0, 1)
    t0, p0 = free.run_step(*prefill)
    cap = (free.run_step(*decode)[1] + p0) / 2
    capped = CostModel(cat.model("llama-3-8b"), g, power_cap_w=cap)
    t1, p1 = capped.run_step(*prefill)
    assert cap - 2 < p1 <= cap        # the governor settles just under the cap ...
    assert t1 > t0                    # ... by slowing the compute-bound step
    assert capped.run_step(*decode) == free.run_step(*decode)     # a step under the cap is untouched


@pytest.mark.parametrize("kwargs, message", [({"gpu_clock": 0.0}, "gpu_clock"), ({"gpu_clock": 1.5}, "gpu_clock"),
                                              ({"power_cap_w": 10.0}, "idle power")])
def test_bad_knob_values_are_user_errors(kwargs, message):
    cat = load_catalog()
    with pytest.raises(UserError, match=message):
        CostModel(cat.model("llama-3-8b"), cat.gpu("h100-sxm"), **kwargs)


@pytest.mark.parametrize("step", [(2048, 2048 * 1024.0, 2048.0, 1),                  # prefill
                                  (512 + 64, 512 * 300.0 + 64 * 800.0, 512 + 64 * 800.0, 65),  # mixed
                                  (64, 64 * 800.0, 64 * 800.0, 64)])                  # decode
def test_energy_per_step_is_u_shaped_in_the_clock(step):
    """VoltanaLLM's observation (A100, 1410 -> 1005 MHz): time rises sub-linearly as the clock
    falls and energy per step has a minimum inside the clock range, not at either end."""
    cat = load_catalog()
    clocks = [0.1 * k for k in range(1, 11)]
    runs = [CostModel(cat.model("llama-3-8b"), cat.gpu("a100-80g"), gpu_clock=c).run_step(*step) for c in clocks]
    energies = [t * p for t, p in runs]
    best = energies.index(min(energies))
    assert 0 < best < len(clocks) - 1, [round(e, 3) for e in energies]
    at_1005 = CostModel(cat.model("llama-3-8b"), cat.gpu("a100-80g"), gpu_clock=1005 / 1410).run_step(*step)[0]
    assert at_1005 / runs[-1][0] < 1410 / 1005


def test_measured_profile_steps_draw_the_state_based_power_not_the_limit():
    """A profile pool's steps: the batch-proportional terms stand for compute (sim/profile.py)."""
    from llmlb_bench.sim.profile import EngineProfile, ProfileCost

    cat = load_catalog()
    g = cat.gpu("h100-sxm")
    prof = EngineProfile.from_dict({"llmlb_profile": 1, "engine": {
        "max_num_seqs": 256, "max_num_batched_tokens": 8192, "block_size": 16, "num_kv_blocks": 10000,
        "max_model_len": 8192, "enable_prefix_caching": False},
        "step": {"base_s": 0.006, "per_token_s": 2.5e-5, "per_sample_s": 1e-6, "per_attn_s": 1e-9, "per_kv_s": 1e-8},
        "request_overhead_s": 0.0})
    c = ProfileCost(prof, cat.model("llama-3-8b"), g)
    t_decode, p_decode = c.run_step(8, 8 * 600.0, 8 * 600.0, 8)
    t_prefill, p_prefill = c.run_step(8192, 8192 * 4096.0, 8192.0, 1)
    floor = g.idle_w + g.memory_power_fraction * (g.max_w - g.idle_w)
    assert floor <= p_decode < floor + 0.1 * (g.max_w - g.idle_w)     # compute share ~3%: near the floor
    assert p_decode < p_prefill <= g.max_w                            # compute share ~97%: near the limit
    assert p_prefill > g.max_w - 0.05 * (g.max_w - g.idle_w)


def test_sequence_overhead_adds_its_time_per_sampled_sequence_and_draws_busy_power():
    """sim/cost.py: the catalog's sequence_overhead_us is s seconds per sampled sequence per step on
    top of the roofline, in run_step, step() and decode_step() alike; the GPU is busy (not computing)."""
    import dataclasses

    cat = load_catalog()
    g = dataclasses.replace(cat.gpu("h100-sxm"), sequence_overhead_us=0.0)
    off = CostModel(cat.model("llama-3-8b"), g)
    on = CostModel(cat.model("llama-3-8b"), dataclasses.replace(g, sequence_overhead_us=40.0))
    for tokens, attn, kv, sampled in ((8, 4800.0, 4800.0, 8), (512 + 300, 512 * 600.0 + 9e4, 512 * 600.0 + 300, 513),
                                      (8192, 8192 * 4096.5, 8192.0, 1)):
        t_off, p_off = off.run_step(tokens, attn, kv, sampled)
        t_on, p_on = on.run_step(tokens, attn, kv, sampled)
        assert t_on - t_off == pytest.approx(40e-6 * sampled, rel=1e-9)
        # same compute in a longer step: a smaller busy share, so no more power (and above the floor)
        assert g.idle_w + g.memory_power_fraction * (g.max_w - g.idle_w) <= p_on <= p_off
    decode = on.decode_step(256, 256 * 600.0)
    assert decode.total == pytest.approx(on.run_step(256, 256 * 600.0, 256 * 600.0, 256)[0], rel=1e-12)
    assert decode.total - off.decode_step(256, 256 * 600.0).total == pytest.approx(256 * 40e-6, rel=1e-9)
    mixed = on.step(300, 9e4, 300.0, 512, 512 * 600.0, 513)
    assert mixed.total == pytest.approx(on.run_step(812, 512 * 600.0 + 9e4, 512 * 600.0 + 300, 513)[0], rel=1e-12)


def test_sequence_overhead_fit_recovers_a_known_overhead():
    """The closed-form least squares of energy_fit: mean steps whose 'measured' time is the
    roofline plus 37 us per sampled sequence give back 37 us."""
    import dataclasses

    from llmlb_bench.sim import energy_fit

    cat = load_catalog()
    g = cat.gpu("h100-sxm")
    truth = dataclasses.replace(g, sequence_overhead_us=37.0)
    steps = [energy_fit.mean_step(c) for c in _cells("llama-3-8b", "h100-sxm", (8, 64, 256, 768))]
    synthetic = [dataclasses.replace(st, measured_s=energy_fit.cost_model(st.cell, truth).run_step(
        st.tokens, st.attn, st.kv, st.sampled)[0]) for st in steps]
    assert energy_fit.fit_sequence_overhead(synthetic, g) == pytest.approx(37.0, rel=1e-9)
    assert abs(energy_fit.step_errors(synthetic, truth)).max() < 1e-12


def test_stored_sequence_overhead_is_what_the_fit_gives():
    """catalog/power_measurements.toml [fit.<gpu>] holds the sequence overhead energy_fit computes
    from the cells' mean steps (a stale or hand-edited value fails here)."""
    from llmlb_bench.sim import energy_fit

    cells = load_measurements()
    fits = load_fits()
    assert set(fits) == {"h100-sxm", "b200"}
    for gpu, stored in fits.items():
        steps = [energy_fit.mean_step(c) for c in cells if c.gpu == gpu and c.model in stored.models]
        assert round(energy_fit.fit_sequence_overhead(steps, load_catalog().gpu(gpu))) == stored.sequence_overhead_us


def test_catalog_carries_the_fitted_terms_and_the_stated_rule_elsewhere():
    """catalog/gpus.toml: the GPUs with measurements carry their [fit.<gpu>] terms (on by default);
    the others no sequence overhead and the power pair H100 was fitted to without it (the header of
    catalog/gpus.toml says why: no measurement bounds their overhead)."""
    cat = load_catalog()
    fits, without = load_fits(), load_fits(table="fit_without_overhead")
    assert set(without) == set(fits)
    for gpu, fit in fits.items():
        g = cat.gpu(gpu)
        assert (g.sequence_overhead_us, g.memory_power_fraction, g.compute_power_scale) == \
            (fit.sequence_overhead_us, fit.memory_power_fraction, fit.compute_power_scale)
        assert fit.sequence_overhead_us > 0 and without[gpu].sequence_overhead_us == 0
    h100 = without["h100-sxm"]
    for name, g in cat.gpus.items():
        if name not in fits:
            assert g.sequence_overhead_us == 0, name
            assert (g.memory_power_fraction, g.compute_power_scale) == \
                (h100.memory_power_fraction, h100.compute_power_scale), name


def test_sequence_overhead_predicts_mean_steps_it_was_not_fitted_to():
    """Out of sample (energy_fit.holdouts): the overhead fitted to one H100 model's mean steps, or to
    the batches up to 128, puts the held-out cells' mean steps closer to the measured ones than the
    roofline without it (docs/fidelity.md has the full simulations)."""
    from llmlb_bench.sim import energy_fit

    cells, fits = load_measurements(), load_fits()
    checks = energy_fit.holdouts(cells, fits)
    assert len(checks) == 4
    for h in checks:
        assert not set(h.train) & set(h.test) and h.train and h.test
        base = load_catalog().gpu(h.gpu)
        s = energy_fit.fit_sequence_overhead([energy_fit.mean_step(c) for c in h.train], base)
        test = [energy_fit.mean_step(c) for c in h.test]
        on = energy_fit.step_errors(test, energy_fit.with_terms(base, sequence_overhead_us=s))
        off = energy_fit.step_errors(test, energy_fit.with_terms(base, sequence_overhead_us=0.0))
        assert s > 0 and (on ** 2).mean() < (off ** 2).mean(), h.name


@pytest.mark.slow
def test_stored_power_terms_are_the_simulated_fit():
    """... and the power floor and scale that fit full simulations best: the floor is the closed-form
    least-squares one at the stored scale, and the neighbouring scales (+-0.01) do no better."""
    import dataclasses

    from llmlb_bench.sim import energy_fit

    cells = load_measurements()
    for gpu, stored in load_fits().items():
        chosen = [c for c in cells if c.gpu == gpu and c.model in stored.models]
        floor, rms = energy_fit.simulated_power_errors(chosen, stored)
        assert round(floor, 2) == stored.memory_power_fraction
        for k in (stored.compute_power_scale - 0.01, stored.compute_power_scale + 0.01):
            assert energy_fit.simulated_power_errors(chosen, dataclasses.replace(stored, compute_power_scale=k))[1] >= rms


#: stated tolerance on the simulated throughput with the fitted sequence overhead, at batches of
#: 128-512 where the roofline alone is 30-54% fast (docs/simulator.md, "Energy against measurements")
THROUGHPUT_TOLERANCE = 0.10


@pytest.mark.parametrize("model, gpu, batches", [("llama-3-8b", "h100-sxm", (128, 256)),
                                                  ("llama-3-70b", "h100-sxm", (256, 512))])
def test_default_terms_bring_large_batch_throughput_and_power_to_the_measurements(model, gpu, batches):
    without = load_fits(table="fit_without_overhead")[gpu]
    for cell in _cells(model, gpu, batches):
        sim = simulate_cell(cell)
        assert abs(sim.throughput_error) <= THROUGHPUT_TOLERANCE, cell.label
        assert abs(sim.power_error) <= POWER_TOLERANCE, cell.label
        # the model before the sequence overhead was on: more than 25% too fast at these batches
        assert simulate_cell(cell, fit=without).throughput_error > 0.25, cell.label

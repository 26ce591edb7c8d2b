"""Roofline cost model: how long one engine step takes and how much KV cache fits.

One step of a replica processes a batch of tokens: prefill chunks (each
attending to its request's earlier tokens) and one decode token per running
request (each attending to its whole context). Its time is

    hypot(FLOPs / (peak FLOP/s x compute_efficiency),
          bytes / (HBM bandwidth x memory_efficiency))
    + tensor-parallel all-reduce time + layers x layer latency + host overhead
    + sampled sequences x sequence overhead

with FLOPs = 2 x active non-embedding parameters per token + 4 x layers x
heads x head_dim per (token, context token) of attention + the LM head per
sampled token, and bytes = the weights read once per step (for a MoE only the
experts the batch touches) + the KV cache read by attention. Everything is per
GPU after tensor-parallel sharding.

``hypot`` (the 2-norm of the two times) is a smooth roofline: it equals the
larger time when one dominates and exceeds it near the knee, where real
kernels neither fully overlap nor fully serialise compute and memory
traffic. Against measured layer timings it has a clearly smaller error
than the sharp ``max`` for batches up to a few hundred tokens (decode
batches), see docs/simulator.md. The layer latency is the fixed cost of a layer's
kernels (launches, small ops) that does not scale with the batch.

The sequence overhead (the catalog's ``sequence_overhead_us``) is time per sampled sequence
per step that none of those terms counts: the sampler's work over the whole vocabulary
(vLLM's sort-based top-p/top-k) and the engine's per-request work in a step. It is what the
roofline leaves out at large batches against measured serving throughput (docs/simulator.md,
"Energy against measurements"). The GPU counts as busy during it, but not its tensor cores
(power: the memory-bound floor). 0 (the default of an entry that leaves it out, and the value of
the built-in GPUs without a measurement to fit it to) leaves every step time as the roofline has it.

All figures come from the catalogs; the efficiency factors and the layer
latency are the fitted part (see :mod:`llmlb_bench.sim.cost_fit`).

A MoE replica with an :class:`~llmlb_bench.sim.moe.ExpertLoad` (expert
parallelism over its ``tp`` GPUs with skewed expert popularity) waits in each
MoE layer for its busiest GPU: the routed experts' compute is multiplied by
the load's imbalance factor f(tokens) (``StepCost.skew_s`` is the extra time).
Power follows the average GPU's work (the balanced compute), since the other
GPUs idle while the busiest one finishes.

Pipeline parallelism (``pp`` stages of ``tp`` GPUs each, vLLM's contiguous
split of the layers) is modelled without micro-batching: one batch goes
through the stages one after the other, and the next step starts when the
last stage has sampled. That is how one step of a batch behaves in any
engine; what it leaves out is vLLM's overlap of up to ``pp`` batches in
flight (v0's virtual engines, v1's batch queue), which would need one
scheduler per in-flight batch in each replica. So a stage runs its share of
the layers, and the sum over stages of the roofline above is the tp-only
step time (every term scales with the layer count, so the sum over stages of
hypot(c_i, m_i) is hypot(sum c, sum m)), plus ``pp - 1`` sends of the batch's
hidden state and residual (2 x tokens x hidden bf16, each TP rank sending its
1/tp slice, as vLLM's ``send_tensor_dict`` does) at the interconnect's
latency and bandwidth. The step's latency is therefore slightly above the
tp-only one while weights and KV per GPU shrink by ``pp``: KV capacity grows
``pp``-fold and more (the weights freed count too), throughput does not.
Memory per GPU is the largest stage's: ceil(layers / pp) of the layers'
weights and KV. Power: the ``pp x tp`` GPUs draw idle power, and only one
stage's ``tp`` GPUs are busy at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import exp, sqrt
from typing import TYPE_CHECKING, overload

from llmlb_bench.errors import UserError
from llmlb_bench.sim.catalog import GPU, Model
from llmlb_bench.sim.moe import ExpertLoad

if TYPE_CHECKING:
    import numpy as np

GIB = float(1 << 30)
#: memory the engine needs besides weights, activations and KV: CUDA context, NCCL buffers, CUDA graphs
NON_TORCH_BYTES = 1.0 * GIB
#: bytes per activation element (bf16 hidden states)
ACTIVATION_BYTES = 2
#: share of the memory-bound power floor a GPU draws while it communicates (all-reduce, pipeline
#: sends): fitted with the floors to the ML.ENERGY measurements (docs/simulator.md)
COMM_POWER_SHARE = 0.5
#: bisection steps that find the clock a power cap allows (2^-20 of the set clock)
CAP_BISECTIONS = 20


def busy_activity(floor: float, scale: float, compute_share: float) -> float:
    """Share of the dynamic power range (max - idle) a GPU draws while it steps a batch whose
    tensor-core busy share is ``compute_share``: the memory-bound ``floor`` rising towards 1,
    floor + (1 - floor) (1 - exp(-share / scale)) (the catalog's ``memory_power_fraction`` and
    ``compute_power_scale``, fitted to the ML.ENERGY measurements; docs/simulator.md)."""
    return floor + (1.0 - floor) * (1.0 - exp(-compute_share / scale))


@overload
def all_reduce_bytes_factor(tp: int) -> float: ...
@overload
def all_reduce_bytes_factor(tp: np.ndarray) -> np.ndarray: ...
def all_reduce_bytes_factor(tp: int | np.ndarray) -> float | np.ndarray:
    """Bytes a ring all-reduce moves over each GPU's link per byte of message: 2 (tp - 1) / tp
    (elementwise over an array of GPU counts, as calibration fits it)."""
    return 2 * (tp - 1) / tp


@dataclass(frozen=True)
class StepCost:
    """The parts of one step's time (seconds); ``total`` is what the simulator uses."""

    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    #: extra compute time of the busiest GPU under expert-load imbalance (MoE with an ExpertLoad)
    skew_s: float = 0.0

    @property
    def total(self) -> float:
        return math.hypot(self.compute_s + self.skew_s, self.memory_s) + self.comm_s + self.overhead_s


class CostModel:
    """Step times and KV capacity for one replica (``tp x pp`` GPUs of one type serving one model)."""

    @staticmethod
    def request_overhead(requests: int, prompt_tokens: int) -> float:
        """Seconds ``requests`` requests (of ``prompt_tokens`` prompt tokens in all) spend between
        their dispatch and the engine's queue: none in the roofline; a measured profile's request
        overhead (see :mod:`llmlb_bench.sim.profile`)."""
        return 0.0

    def __init__(self, model: Model, gpu: GPU, tp: int = 1, *, pp: int = 1, max_num_batched_tokens: int = 8192,
                 max_num_seqs: int = 256, gpu_memory_utilization: float = 0.9, block_size: int = 16,
                 compute_efficiency: float | None = None, memory_efficiency: float | None = None,
                 expert_load: ExpertLoad | None = None, gpu_clock: float = 1.0,
                 power_cap_w: float | None = None) -> None:
        self.model, self.gpu, self.tp, self.pp = model, gpu, tp, pp
        #: GPUs of one replica
        self.gpus = tp * pp
        #: share of the layers (weights, KV) on the largest pipeline stage
        self.stage_fraction = -(-model.layers // pp) / model.layers
        ce = gpu.compute_efficiency if compute_efficiency is None else compute_efficiency
        me = gpu.memory_efficiency if memory_efficiency is None else memory_efficiency
        #: tensor throughput at the full SM clock; ``peak_flops`` is at the clock set (:meth:`set_clock`)
        self.full_clock_flops = gpu.bf16_tflops * 1e12 * ce
        self.peak_flops = self.full_clock_flops
        self.bandwidth = gpu.hbm_gb_s * 1e9 * me
        embed = model.vocab * model.hidden
        lm_head_params = 0 if model.tied_embeddings else embed
        # Per-token linear FLOPs exclude the embedding lookup and the LM head (counted per sampled token).
        self.linear_flops = 2.0 * (model.active_params_b * 1e9 - embed - lm_head_params) / tp
        self.lm_head_flops = 2.0 * embed / tp
        self.attn_flops = 4.0 * model.layers * model.heads * model.head_dim / tp
        params = model.params_b * 1e9
        if model.is_moe:
            per_expert = (params - model.active_params_b * 1e9) / (model.experts - model.active_experts)
            self.expert_bytes = per_expert * model.experts * model.weight_bytes / tp
            self.dense_bytes = (params - per_expert * model.experts) * model.weight_bytes / tp
            self._miss = 1.0 - model.active_experts / model.experts
            # routed experts' share of the per-token FLOPs, which expert-load imbalance stretches
            self.expert_flops = 2.0 * model.active_experts * per_expert / tp
            if expert_load is not None:     # EPLB's redundant replicas: (E + R) / E the expert weights
                self.expert_bytes *= (model.experts + expert_load.spec.redundant_experts) / model.experts
        else:
            self.expert_bytes = 0.0
            self.dense_bytes = params * model.weight_bytes / tp
            self._miss = 1.0
            self.expert_flops = 0.0
        self.expert_load = expert_load if model.is_moe else None
        # (dense_bytes and expert_bytes are per TP rank over all stages: what one step reads, stage after stage)
        #: weight bytes on one GPU (the largest stage)
        self.weight_bytes = (self.dense_bytes + self.expert_bytes) * self.stage_fraction
        # GQA KV heads are split across TP ranks (replicated when tp > kv_heads); MLA's latent is replicated.
        kv_shards = 1 if model.kv_lora_rank else min(tp, model.kv_heads)
        #: KV bytes of one token per TP rank over all stages (what attention reads in a step)
        self.kv_bytes_per_token = model.kv_bytes_per_token / kv_shards
        #: ... and on one GPU (the largest stage): what capacity and swap copies count
        self.kv_bytes_per_token_gpu = self.kv_bytes_per_token * self.stage_fraction
        self.overhead_s = gpu.step_overhead_ms / 1000.0 + model.layers * gpu.layer_latency_us * 1e-6
        #: seconds per sampled sequence per step (the catalog's ``sequence_overhead_us``; see the module docstring)
        self.sequence_overhead_s = gpu.sequence_overhead_us * 1e-6
        # Two all-reduces of the hidden state per layer (after attention and after the MLP), each
        # costing a fixed latency plus the ring's 2 (tp-1)/tp of the message over the link bandwidth.
        if tp > 1:
            ar_fixed = 2 * model.layers * gpu.link_latency_us * 1e-6
            ar_per_token = (2 * model.layers * all_reduce_bytes_factor(tp) * model.hidden * ACTIVATION_BYTES
                            / (gpu.link_gb_s * 1e9))
        else:
            ar_fixed = ar_per_token = 0.0
        # Pipeline sends between stages (see the module docstring): a latency and 2 x hidden / tp bytes per token each.
        self.pp_send_fixed = (pp - 1) * gpu.link_latency_us * 1e-6
        self.pp_send_per_token = (pp - 1) * 2 * model.hidden * ACTIVATION_BYTES / tp / (gpu.link_gb_s * 1e9)
        #: communication per step: a fixed part and seconds per token of the batch
        self._comm_fixed = ar_fixed + self.pp_send_fixed
        self._comm_per_token = ar_per_token + self.pp_send_per_token
        self.kv_blocks = self._kv_blocks(max_num_batched_tokens, max_num_seqs, gpu_memory_utilization, block_size)
        self.block_size = block_size
        #: seconds to copy one KV block between GPU and host memory (KV swap): every GPU copies its
        #: own shard over its own host link, in parallel, so one GPU's share of the bytes counts
        self.swap_block_s = self.kv_bytes_per_token_gpu * block_size / (gpu.host_link_gb_s * 1e9)
        #: engine seconds a request's frontend work takes from the steps: none in the roofline (a
        #: measured profile's ``frontend_cpu_s``, sim/profile.py)
        self.frontend_cpu_s = 0.0
        #: its parts charged to the step the arriving request waits behind, and after its first token
        self.frontend_wait_s = 0.0
        self.frontend_after_s = 0.0
        self._m_kv = self.kv_bytes_per_token / self.bandwidth
        self._m_dense = self.dense_bytes / self.bandwidth
        self._fixed = self.overhead_s + self._comm_fixed
        self._idle_w = self.gpus * gpu.idle_w
        self._dyn_w = tp * (gpu.max_w - gpu.idle_w)
        self._floor = gpu.memory_power_fraction
        self._k = gpu.compute_power_scale
        self._comm_floor = COMM_POWER_SHARE * gpu.memory_power_fraction
        #: the fastest possible decode step (all weights, no context): a floor for step times
        self.min_step_s = self._fixed + self._m_dense
        self.set_clock(gpu_clock, power_cap_w)

    def set_clock(self, gpu_clock: float = 1.0, power_cap_w: float | None = None) -> None:
        """Set the SM clock (a fraction of the GPU's maximum, as ``nvidia-smi -lgc`` locks it) and
        the board power limit per GPU (watts, ``nvidia-smi -pl``; None = the GPU's own, ``max_w``).

        The knob of green serving (DynamoLLM, VoltanaLLM): the clock scales the tensor-core
        throughput, so compute-bound work (prefill) slows in proportion, while HBM traffic,
        communication and the host's work keep their speed, so memory-bound decode slows much
        less (measured: decode is largely insensitive to the SM clock, arXiv 2501.08219). The
        dynamic power of a busy GPU scales as :meth:`clock_power` says (part of it, HBM and
        leakage, does not follow the clock). A power limit lowers the clock further, step by step, just enough for
        the step's power to fit under it, as the GPU's power governor does; a memory-bound step
        drawing less than the limit is not slowed at all. Steps planned after the call see the
        new setting (a decode run in flight keeps its own). Both at their defaults, step times
        and power are the exact same floats as without the knob."""
        if not 0 < gpu_clock <= 1:
            raise UserError(f"gpu_clock must be a fraction of the maximum clock in (0, 1], got {gpu_clock!r}",
                            "gpu_clock")
        g = self.gpu
        if power_cap_w is not None and not g.idle_w < power_cap_w:
            raise UserError(f"power_cap_w must be above the GPU's idle power ({g.idle_w:g} W), got {power_cap_w!r}",
                            "power_cap_w")
        self.gpu_clock = gpu_clock
        self.power_cap_w = power_cap_w if power_cap_w is not None and power_cap_w < g.max_w else None
        self.peak_flops = self.full_clock_flops * gpu_clock
        self._clock_power = self.clock_power(gpu_clock)
        # the largest activity x clock factor a busy GPU may reach under the cap (None: no cap)
        self._cap_activity = ((self.power_cap_w - g.idle_w) / (g.max_w - g.idle_w)
                              if self.power_cap_w is not None else None)
        # Largest d(step time)/d(context token): bounds how fast a decode step slows down as contexts grow.
        self.context_slope = math.hypot(self.attn_flops / self.peak_flops, self.kv_bytes_per_token / self.bandwidth)
        #: the roofline's attention is per request (no term in the batch's tokens x KV; sim/profile.py's per_dense_s)
        self.dense_slope = 0.0
        # Coefficients of the simulator's hot path (:meth:`run_step`): seconds per unit.
        self._c_token = self.linear_flops / self.peak_flops
        self._c_sample = self.lm_head_flops / self.peak_flops
        self._c_attn = self.attn_flops / self.peak_flops
        self._c_expert = self.expert_flops / self.peak_flops

    def _kv_blocks(self, max_tokens: int, max_seqs: int, util: float, block_size: int) -> int:
        """KV blocks per replica: GPU memory x utilisation - weights - activation peak - non-torch memory,
        on the GPU of the largest stage (vLLM takes the smallest block count over its workers)."""
        m = self.model
        budget = self.gpu.memory_gib * GIB * util
        # Peak activations of a full-budget forward pass (hidden states, MLP intermediates) + fp32 logits.
        activations = (max_tokens * (4 * m.hidden + 2 * m.intermediate * max(1, m.active_experts) / self.tp) * 2
                       + max_seqs * m.vocab * 4)
        free = budget - self.weight_bytes - activations - NON_TORCH_BYTES
        blocks = int(free // (self.kv_bytes_per_token_gpu * block_size))
        if blocks < 1:
            raise UserError(
                f"{m.name} does not fit on {self.gpus} x {self.gpu.name}: weights {self.weight_bytes / GIB:.1f} GiB "
                f"+ activations {(activations + NON_TORCH_BYTES) / GIB:.1f} GiB per GPU exceed "
                f"{budget / GIB:.1f} GiB usable; raise tp, pp or gpu_memory_utilization", "cluster")
        return blocks

    def swap_blocks(self, swap_space_gib: float) -> int:
        """KV blocks that ``swap_space_gib`` of CPU memory per GPU holds (vLLM v0: swap_space // block bytes)."""
        return int(swap_space_gib * GIB // (self.kv_bytes_per_token_gpu * self.block_size))

    def weights_read(self, tokens: int) -> float:
        """Weight bytes one step reads: all dense weights, and the experts that ``tokens`` tokens touch.

        With top-k routing spread evenly over E experts, an expert stays untouched by
        T tokens with probability (1 - k/E)^T.
        """
        if not self.expert_bytes:
            return self.dense_bytes
        return self.dense_bytes + self.expert_bytes * (1.0 - self._miss ** tokens)

    def step(self, prefill_tokens: int, prefill_attn: float, prefill_kv: float, decode_seqs: int,
             decode_context: float, sampled: int) -> StepCost:
        """Cost of one step.

        ``prefill_attn``: sum over prefill tokens of the context each attends to;
        ``prefill_kv``: KV tokens the prefill chunks read or write;
        ``decode_context``: sum over decoding requests of their context (each reads it once);
        ``sampled``: requests that sample a token this step (LM head).
        """
        tokens = prefill_tokens + decode_seqs
        flops = (self.linear_flops * tokens + self.attn_flops * (prefill_attn + decode_context)
                 + self.lm_head_flops * sampled)
        data = self.weights_read(tokens) + self.kv_bytes_per_token * (prefill_kv + decode_context)
        comm = self._comm_fixed + self._comm_per_token * tokens if tokens else 0.0
        return StepCost(flops / self.peak_flops, data / self.bandwidth, comm,
                        self.overhead_s + self.sequence_overhead_s * sampled, self._skew(tokens))

    def _skew(self, tokens: int) -> float:
        """Extra seconds the busiest GPU spends on routed experts (0 without an ExpertLoad)."""
        if self.expert_load is None or not tokens:
            return 0.0
        return self._c_expert * tokens * (self.expert_load.factor(tokens) - 1.0)

    def decode_step(self, seqs: int, context: float) -> StepCost:
        """A decode-only step of ``seqs`` requests with ``context`` total context tokens."""
        compute = ((self.linear_flops + self.lm_head_flops) * seqs + self.attn_flops * context) / self.peak_flops
        memory = (self.weights_read(seqs) + self.kv_bytes_per_token * context) / self.bandwidth
        return StepCost(compute, memory, self._comm_fixed + self._comm_per_token * seqs,
                        self.overhead_s + self.sequence_overhead_s * seqs,
                        self._skew(seqs))

    def decode_time(self, seqs: int, context: float) -> float:
        return self.decode_step(seqs, context).total

    def clock_power(self, clock: float) -> float:
        """A busy GPU's dynamic power at SM clock ``clock`` relative to the full clock's:
        the clock-invariant share (HBM, memory controllers, leakage) plus the rest scaling as
        clock ** ``clock_power_exponent``. Exactly 1.0 at the full clock."""
        g = self.gpu
        if clock == 1.0:
            return 1.0
        rel: float = g.clock_invariant_power + (1.0 - g.clock_invariant_power) * clock ** g.clock_power_exponent
        return rel

    def run_step(self, tokens: int, attn: float, kv: float, sampled: int) -> tuple[float, float]:
        """(step time, power) of a step with ``tokens`` new tokens attending to ``attn`` context
        tokens in total and reading ``kv`` KV tokens: :meth:`step` and :meth:`power_w` without
        the intermediate object, for the simulator's inner loop (identical arithmetic)."""
        compute = self._c_token * tokens + self._c_attn * attn + self._c_sample * sampled
        memory = (self._m_dense + (self.expert_bytes * (1.0 - self._miss ** tokens) / self.bandwidth
                                   if self.expert_bytes else 0.0) + self._m_kv * kv)
        comm = self._comm_per_token * tokens
        seq = self.sequence_overhead_s * sampled
        if self.expert_load is None:
            total = sqrt(compute * compute + memory * memory) + self._fixed + comm + seq
        else:
            skewed = compute + self._skew(tokens)
            total = sqrt(skewed * skewed + memory * memory) + self._fixed + comm + seq
        activity = self._activity(compute, self._comm_fixed + comm, total) * self._clock_power
        if self._cap_activity is not None and activity > self._cap_activity:
            return self._capped(compute, memory, comm, tokens, seq)
        return total, self._idle_w + self._dyn_w * activity

    def _activity(self, compute: float, comm: float, total: float) -> float:
        """Share of the dynamic power range (max - idle) a busy GPU draws during a step at the
        full clock: the state-based model fitted to the ML.ENERGY measurements (docs/simulator.md,
        "Energy against measurements"). While the GPU steps a batch it draws at least the
        ``memory_power_fraction`` floor (clocks up, HBM streaming, small kernels), rising towards
        the limit as the tensor cores' busy share u = compute / step time grows:
        floor + (1 - floor) (1 - exp(-u / compute_power_scale)); during the step's
        communication it draws COMM_POWER_SHARE of the floor."""
        if total <= 0:
            return 0.0
        busy = busy_activity(self._floor, self._k, compute / total)
        share = comm / total
        return (1.0 - share) * busy + share * self._comm_floor

    def _capped(self, compute: float, memory: float, comm: float, tokens: int, seq: float) -> tuple[float, float]:
        """(step time, power) of a step whose power at the set clock exceeds the cap: the clock
        the GPU's governor would settle at, the highest that keeps the step's power under the
        cap (bisection; compute time grows as the clock falls)."""
        cap = self._cap_activity
        assert cap is not None      # called only under a power cap
        lo, hi = 0.0, 1.0           # the clock, as a fraction of the set one: lo fits under the cap, hi does not
        best = (0.0, 0.0)
        for _ in range(CAP_BISECTIONS):
            mid = (lo + hi) / 2
            c = compute / mid
            skewed = c + (self._skew(tokens) / mid if self.expert_load is not None else 0.0)
            total = sqrt(skewed * skewed + memory * memory) + self._fixed + comm + seq
            activity = self._activity(c, self._comm_fixed + comm, total) * self.clock_power(self.gpu_clock * mid)
            if activity <= cap:
                lo, best = mid, (total, self._idle_w + self._dyn_w * activity)
            else:
                hi = mid
        return best

    def power_w(self, c: StepCost) -> float:
        """Average power of the replica's ``tp x pp`` GPUs during a step at the set clock.

        All draw idle power; one stage's ``tp`` GPUs at a time add (max - idle) x activity x
        clock ** ``clock_power_exponent``, activity as :meth:`_activity` says (compute busy share
        of the step, with the memory-bound floor and the communication share). Under a power cap
        the result is at most the cap (:meth:`run_step` also stretches such a step).
        """
        total = c.total
        activity = self._activity(c.compute_s, c.comm_s, total) * self._clock_power
        if self._cap_activity is not None:
            activity = min(activity, self._cap_activity)
        return self._idle_w + self._dyn_w * activity

    @property
    def idle_power_w(self) -> float:
        return self.gpus * self.gpu.idle_w

"""Cost model: memory per device and seconds per node for one role's layout.

The runtime this models (see DESIGN.md) trains and scores with torch FSDP and
generates with a tensor-parallel rollout engine, as verl does:
- every role's train and forward passes run FSDP (ZeRO-3) over all n devices
  of its pool: weights (and, for trained roles, grads and Adam states) are
  sharded n ways and gathered layer by layer for each micro-batch;
- a generating role additionally runs its rollout as dp = n / tp replicas of
  tp devices (a tp group never spans nodes). Its layout (dp, tp) is this
  rollout layout; a role that does not generate has layout (n, 1).

Memory (per device): 16 bytes/param / n for a trained role (bf16 weights and
grads, fp32 master weights, Adam moments), 2 bytes/param / n for a frozen one,
plus the transient memory of the node that runs: one micro-batch's
activations, or the rollout weights and the KV cache. With LoRA
(`ModelSpec.lora_rank`) the trained role holds its frozen base in bf16 plus
16 bytes per adapter param, and a frozen role (the reference) holds nothing: it
is the actor with its adapters off.

Time (per node):
- train and forward passes are compute-bound: FLOPs / (peak * MFU) per
  micro-batch, overlapped with that micro-batch's weight gathers, so a pass
  over few sequences per device becomes bound by gathers that do not shrink
  as the pool grows;
- generate is memory-bandwidth-bound: each decode step reads the rollout
  weights and the KV cache; the decode batch is capped by the memory left;
- the actor switches from training to generation once a step: the rollout
  weights are all-gathered from the training shards (weight resharding).

Every efficiency number below is an assumption; docs/placement.md says how to
calibrate them against a measured step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .devices import Cluster
from .models import BF16_BYTES, ModelSpec
from .problem import Problem, Workload

# --- assumptions (calibrate these) -----------------------------------------
MFU_TRAIN = 0.40  # fraction of peak bf16 FLOP/s reached by forward+backward
MFU_FORWARD = 0.50  # forward-only passes and rollout prefill
MFU_DECODE = 0.40  # decode when a batch is large enough to be compute-bound
HBM_EFFICIENCY = 0.75  # fraction of peak memory bandwidth reached by decode
LINK_EFFICIENCY = 0.70  # fraction of peak link bandwidth reached by collectives
INTRA_NODE_LATENCY_S = 15e-6  # fixed cost of one collective over NVLink
INTER_NODE_LATENCY_S = 50e-6  # fixed cost of one collective across nodes
DECODE_STEP_OVERHEAD_S = 2e-3  # scheduler, sampling and launches per decode step
ENGINE_SWITCH_S = 1.0  # rollout engine wake-up/sleep (KV cache alloc/free) per step
NODE_CALL_OVERHEAD_S = 0.05  # driver dispatch and collect per node call
MEMORY_USABLE_FRACTION = 0.90  # CUDA context, NCCL buffers, fragmentation
MAX_DECODE_BATCH = 256  # sequences decoded at once per replica (vLLM max_num_seqs)
PREFILL_CHUNK_TOKENS = 8192  # tokens per prefill chunk (workspace memory)

# --- accounting facts -------------------------------------------------------
TRAIN_STATE_BYTES = 16  # bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam 8
OPTIMIZER_TRAFFIC_BYTES = 32  # Adam reads and writes every state once a step
TRAIN_PASS_FLOPS = 4  # forward + backward (2x) + recomputed forward (checkpointing)
TP_ALLREDUCES_DECODE = 2  # rollout, per layer: after attention and after the MLP
FSDP_COLLECTIVES_TRAIN = 3  # per micro-batch: gather fwd, gather bwd, reduce-scatter
FSDP_COLLECTIVES_FORWARD = 1  # per micro-batch: gather fwd
ACTIVATION_BYTES_TRAIN = 34  # per token per hidden unit of one layer (Korthikanti et al.)
ACTIVATION_BYTES_FORWARD = 16  # live forward buffers per token per hidden unit
LOGIT_BYTES = 4  # fp32 logits per vocab entry (x2 in training for their grad)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int


@dataclass(frozen=True)
class RoleCost:
    """One role at one layout on n devices, independent of its pool mates."""

    role: str
    layout: Layout
    static_bytes: float
    transient_bytes: float  # peak over the role's non-generate nodes
    transient_node: str | None
    node_seconds: dict[str, float] = field(hash=False)  # non-generate nodes


@dataclass(frozen=True)
class GenerateCost:
    seconds: float
    batch: int  # sequences decoded at once per replica
    waves: int
    transient_bytes: float  # rollout weights + KV cache + workspace


def tp_options(cluster: Cluster, model: ModelSpec, devices: int, generates: bool) -> list[int]:
    """Rollout tensor-parallel sizes: powers of two inside a node dividing the pool and the heads.

    A role that does not generate runs only FSDP passes: its only layout is tp=1.
    """
    if not generates:
        return [1]
    sizes, tp = [], 1
    while tp <= min(devices, cluster.gpus_per_node):
        if devices % tp == 0 and model.heads % tp == 0:
            sizes.append(tp)
        tp *= 2
    return sizes


def usable_bytes(cluster: Cluster) -> float:
    return cluster.spec.memory_bytes * MEMORY_USABLE_FRACTION


def forward_flops_per_token(model: ModelSpec, context: int) -> float:
    # 2 FLOPs per parameter plus causal attention over `context` tokens.
    return 2 * model.params + 2 * model.layers * context * model.hidden


def allreduce_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (bandwidth * LINK_EFFICIENCY) + latency


def allgather_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (bandwidth * LINK_EFFICIENCY) + latency


class CostModel:
    """Memoised costs for one problem; all methods are pure functions of their arguments."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.cluster = problem.cluster
        self.device = problem.cluster.spec
        self.workload: Workload = problem.workload
        self.usable = usable_bytes(problem.cluster)
        self._roles: dict[tuple, RoleCost] = {}
        self._generate: dict[tuple, GenerateCost | None] = {}

    # links: a tp group sits inside a node; dp collectives cross nodes when the pool does
    def _dp_link(self, devices: int) -> tuple[float, float]:
        if devices > self.cluster.gpus_per_node:
            return self.device.inter_node_bandwidth, INTER_NODE_LATENCY_S
        return self.device.intra_node_bandwidth, INTRA_NODE_LATENCY_S

    def _tp_allreduce(self, nbytes: float, tp: int) -> float:  # rollout only
        return allreduce_seconds(nbytes, tp, self.device.intra_node_bandwidth, INTRA_NODE_LATENCY_S)

    def static_bytes(self, role: str, devices: int) -> float:
        model = self.problem.models[role]
        if model.lora_rank and not self.problem.trains(role):
            return 0.0  # the LoRA actor with its adapters off serves it: no weights of its own
        if model.lora_rank:  # frozen bf16 base, full training state for the adapters only
            return (BF16_BYTES * model.params + TRAIN_STATE_BYTES * model.lora_params) / devices
        per_param = TRAIN_STATE_BYTES if self.problem.trains(role) else BF16_BYTES
        return per_param * model.params / devices

    def role_cost(self, role: str, devices: int, tp: int) -> RoleCost:
        key = (role, devices, tp)
        if key not in self._roles:
            self._roles[key] = self._role_cost(role, devices, Layout(devices // tp, tp))
        return self._roles[key]

    def _role_cost(self, role: str, devices: int, layout: Layout) -> RoleCost:
        seconds, peak, peak_node = {}, 0.0, None
        for node in self.problem.role_nodes(role):
            if node.kind == "generate":
                continue
            train = node.kind == "train"
            seconds[node.name], transient = self._pass(role, devices, train)
            if transient > peak:
                peak, peak_node = transient, node.name
        return RoleCost(role, layout, self.static_bytes(role, devices), peak, peak_node, seconds)

    def _micro_batches(self, sequences: int) -> tuple[int, int]:
        """(count, sequences each) for `sequences` on one rank, capped by micro_batch_tokens."""
        per_micro = max(1, self.workload.micro_batch_tokens // self.workload.seq_len)
        count = math.ceil(sequences / per_micro)
        return count, math.ceil(sequences / count)

    def _pass(self, role: str, devices: int, train: bool) -> tuple[float, float]:
        """Seconds and transient bytes of one inference or train node (FSDP over `devices`)."""
        model, work = self.problem.models[role], self.workload
        seqs_per_rank = math.ceil(work.sequences / devices)
        steps = work.ppo_epochs * work.mini_batches if train else 1
        per_mini = math.ceil(seqs_per_rank / (work.mini_batches if train else 1))
        count, seqs = self._micro_batches(per_mini)
        tokens = seqs * work.seq_len
        micro = self._micro_batch_seconds(role, devices, tokens, train)
        optimizer = 0.0
        if train:  # Adam touches every local state once per optimizer step
            optimizer = OPTIMIZER_TRAFFIC_BYTES * model.params / devices / (
                self.device.memory_bandwidth * HBM_EFFICIENCY)
        seconds = steps * (count * micro + optimizer) + NODE_CALL_OVERHEAD_S
        return seconds, self._activation_bytes(role, tokens, train)

    def _micro_batch_seconds(self, role: str, devices: int, tokens: int, train: bool) -> float:
        model = self.problem.models[role]
        flops = forward_flops_per_token(model, self.workload.seq_len) * tokens
        if train:
            compute = TRAIN_PASS_FLOPS * flops / (self.device.bf16_flops * MFU_TRAIN)
        else:
            compute = flops / (self.device.bf16_flops * MFU_FORWARD)
        collectives = FSDP_COLLECTIVES_TRAIN if train else FSDP_COLLECTIVES_FORWARD
        bandwidth, latency = self._dp_link(devices)
        gathers = collectives * allgather_seconds(BF16_BYTES * model.params, devices, bandwidth,
                                                  latency)
        return max(compute, gathers)  # FSDP prefetch overlaps gathers with compute

    def _activation_bytes(self, role: str, tokens: int, train: bool) -> float:
        model = self.problem.models[role]
        logits = tokens * model.vocab * LOGIT_BYTES
        if train:  # checkpointed layer inputs + one layer recomputed + logits and their grad
            acts = tokens * model.hidden * (model.layers * BF16_BYTES + ACTIVATION_BYTES_TRAIN)
            logits *= 2
        else:
            acts = tokens * model.hidden * ACTIVATION_BYTES_FORWARD
        # two FSDP units (layers) gathered at once, with their grads in training
        layer = BF16_BYTES * model.params / model.layers
        return acts + logits + 2 * layer * (2 if train else 1)

    # --- generation --------------------------------------------------------
    def generate_fixed_bytes(self, role: str, tp: int) -> float:
        """Rollout weights plus prefill workspace: needed before any KV cache."""
        model = self.problem.models[role]
        workspace = PREFILL_CHUNK_TOKENS * (model.hidden * ACTIVATION_BYTES_FORWARD
                                            + model.vocab * LOGIT_BYTES)
        return (BF16_BYTES * model.params + workspace) / tp

    def kv_bytes_per_sequence(self, role: str, tp: int) -> float:
        model = self.problem.models[role]
        # KV heads are split by tp; beyond kv_heads they are replicated.
        return self.workload.seq_len * model.kv_bytes_per_token / min(tp, model.kv_heads)

    def generate_cost(self, role: str, devices: int, tp: int,
                      free_bytes: float) -> GenerateCost | None:
        """Rollout time given the memory left by the pool's static state; None if no sequence
        fits."""
        kv = self.kv_bytes_per_sequence(role, tp)
        room = free_bytes - self.generate_fixed_bytes(role, tp)
        batch_cap = min(MAX_DECODE_BATCH, int(room // kv)) if room > 0 else 0
        key = (role, devices, tp, batch_cap)
        if key not in self._generate:
            self._generate[key] = self._generate_cost(role, devices, Layout(devices // tp, tp),
                                                      batch_cap)
        return self._generate[key]

    def _generate_cost(self, role: str, devices: int, layout: Layout,
                       batch_cap: int) -> GenerateCost | None:
        if batch_cap < 1:
            return None
        # Waves of equal size: the fewest the KV cache allows, as a continuous
        # batching engine keeps its batch full.
        per_replica = math.ceil(self.workload.sequences / layout.dp)
        waves = math.ceil(per_replica / batch_cap)
        small, big_waves = divmod(per_replica, waves)
        batch = small + (1 if big_waves else 0)
        seconds = big_waves * self._wave_seconds(role, layout, small + 1)
        seconds += (waves - big_waves) * self._wave_seconds(role, layout, small)
        bandwidth, latency = self._dp_link(devices)
        shard = BF16_BYTES * self.problem.models[role].params / layout.tp
        reshard = allgather_seconds(shard, layout.dp, bandwidth, latency)
        seconds += ENGINE_SWITCH_S + reshard + NODE_CALL_OVERHEAD_S
        transient = (self.generate_fixed_bytes(role, layout.tp)
                     + batch * self.kv_bytes_per_sequence(role, layout.tp))
        return GenerateCost(seconds, batch, waves, transient)

    def _wave_seconds(self, role: str, layout: Layout, batch: int) -> float:
        """Prefill `batch` prompts, then decode response_len steps for all of them."""
        model, work, tp = self.problem.models[role], self.workload, layout.tp
        prefill_tokens = batch * work.prompt_len
        prefill = forward_flops_per_token(model, work.prompt_len) * prefill_tokens / (
            tp * self.device.bf16_flops * MFU_FORWARD)
        prefill += TP_ALLREDUCES_DECODE * model.layers * self._tp_allreduce(
            prefill_tokens * model.hidden * BF16_BYTES, tp)
        context = work.prompt_len + work.response_len / 2  # mean context while decoding
        kv_read = batch * context * model.kv_bytes_per_token / min(tp, model.kv_heads)
        read = BF16_BYTES * model.params / tp + kv_read
        memory_bound = read / (self.device.memory_bandwidth * HBM_EFFICIENCY)
        compute_bound = forward_flops_per_token(model, int(context)) * batch / (
            tp * self.device.bf16_flops * MFU_DECODE)
        allreduce = self._tp_allreduce(batch * model.hidden * BF16_BYTES, tp)
        comm = TP_ALLREDUCES_DECODE * model.layers * allreduce
        step = max(memory_bound, compute_bound) + comm + DECODE_STEP_OVERHEAD_S
        return prefill + work.response_len * step

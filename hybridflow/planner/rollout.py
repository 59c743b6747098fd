"""Rollout cost: one generate node on dp = n / tp replicas of a tensor-parallel engine.

A replica decodes its m = N / dp sequences with continuous batching: up to
`batch` sequences at once (the KV memory left, at most MAX_DECODE_BATCH);
a finished sequence's slot is refilled at once. So it runs
    steps = max(m x mean response / batch, expected longest of its m responses)
decode steps (lengths.py), each at the mean occupancy m x mean / steps. When
the engine is fed `rollout_call_sequences` = b at a time (a system that makes
experience micro-batch by micro-batch), it runs m / b calls of b sequences,
each paying that formula with m = b: its own prefill and its own long tail. A step
is memory-bound (rollout weights and KV cache read at HBM efficiency, which
falls with tp) or compute-bound, plus 2 L tensor-parallel all-reduces, the
engine's fixed per-step overhead and its operator launches. Before decoding, a
prefill of the m prompts; once per step, the engine switch (wake-up, weights
resharded from the training shards) — unless the role holds weights of its own on
a pool apart from its host (an async split): its engine stays awake, and the
weights arrive by the sync (`export_seconds`, `load_seconds`). Streaming
(`Pipeline.streaming`): the engine holds up to k + 1 batches' requests, so a replica
decodes up to min(cap, (k + 1) m) at once and a batch's share costs m x mean / batch
steps, its tail overlapped with the next batch's requests. Stateless.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .formulas import (ACTIVATION_BYTES_FORWARD, BF16_BYTES, LOGIT_BYTES, MAX_DECODE_BATCH,
                       PREFILL_CHUNK_TOKENS, TP_ALLREDUCES_FORWARD, Layout, allgather_seconds,
                       forward_flops_per_token, pass_ops)
from .lengths import expected_longest
from .models import ModelSpec
from .problem import Workload

SAMPLING_OPS = 30  # logits processing and sampling launches per decode step


@dataclass(frozen=True)
class GenerateCost:
    seconds: float
    batch: int  # sequences decoded at once per replica
    waves: int  # batches' worth of sequences per replica
    transient_bytes: float  # rollout weights + KV cache + workspace
    decode_steps: float = 0.0


def generate_fixed_bytes(model: ModelSpec, tp: int) -> float:
    """Rollout weights plus prefill workspace: needed before any KV cache."""
    workspace = PREFILL_CHUNK_TOKENS * (model.hidden * ACTIVATION_BYTES_FORWARD
                                        + model.vocab * LOGIT_BYTES)
    return (BF16_BYTES * model.params + workspace) / tp


def kv_bytes_per_sequence(model: ModelSpec, work: Workload, tp: int) -> float:
    # Paged KV grows with the sequence: a slot holds the prompt and a mean response.
    # KV heads are split by tp; beyond kv_heads they are replicated.
    return work.mean_seq_len * model.kv_bytes_per_token / min(tp, model.kv_heads)


def batch_cap(model: ModelSpec, work: Workload, tp: int, free_bytes: float) -> int:
    room = free_bytes - generate_fixed_bytes(model, tp)
    if room <= 0:
        return 0
    return min(MAX_DECODE_BATCH, int(room // kv_bytes_per_sequence(model, work, tp)))


def rollout_cost(cost, role: str, devices: int, layout: Layout, cap: int) -> GenerateCost | None:
    """`cost` is the CostModel (device, efficiency, workload); None when no sequence fits."""
    if cap < 1:
        return None
    model, work, eff = cost.problem.models[role], cost.workload, cost.eff
    per_replica = math.ceil(work.sequences / layout.dp)
    calls, per_call = call_split(work, per_replica)
    pipeline = cost.problem.pipeline
    if pipeline is not None and pipeline.streaming:
        # the engine holds up to k + 1 batches' requests and refills a slot as soon as a
        # sequence ends: no batch waits for its longest response (streaming.py)
        batch = min(cap, (pipeline.staleness + 1) * per_call)
        steps, occupancy = per_call * work.mean_response_len / batch, batch
    else:
        batch = min(cap, per_call)
        steps, occupancy = call_decode_steps(work, per_call, batch)
    seconds = calls * prefill_seconds(cost, model, layout.tp, per_call)
    seconds += calls * steps * decode_step_seconds(cost, model, layout.tp, occupancy)
    if role not in cost.problem.own_weights:  # apart: no sleep and wake, weights come by sync
        seconds += switch_seconds(cost, model, devices, layout)
    seconds += eff.node_call_overhead_s
    transient = (generate_fixed_bytes(model, layout.tp)
                 + batch * kv_bytes_per_sequence(model, work, layout.tp))
    return GenerateCost(seconds, batch, math.ceil(per_replica / batch), transient, calls * steps)


def call_split(work: Workload, per_replica: int) -> tuple[int, int]:
    """(calls, sequences per call) for a replica's share: one call, or calls of
    `rollout_call_sequences` (the last one may be partial; costed as full)."""
    size = work.rollout_call_sequences
    if not size or size >= per_replica:
        return 1, per_replica
    return math.ceil(per_replica / size), size


def call_decode_steps(work: Workload, sequences: int, batch: int) -> tuple[float, float]:
    """(decode steps, mean occupancy) of one call decoding `sequences` at most `batch` at
    once: the tokens over the batch, or the call's longest response, whichever is more.
    Each call pays its own tail: the next call starts when the longest is done."""
    tokens = sequences * work.mean_response_len
    steps = max(tokens / batch, expected_longest(work, sequences))
    return steps, tokens / steps


def prefill_seconds(cost, model: ModelSpec, tp: int, prompts: int) -> float:
    work, eff, device = cost.workload, cost.eff, cost.device
    tokens = prompts * work.prompt_len
    compute = forward_flops_per_token(model, work.prompt_len) * tokens / (
        tp * device.bf16_flops * eff.mfu_forward * eff.tp_factor(tp))
    chunks = math.ceil(tokens / PREFILL_CHUNK_TOKENS)
    reduce = TP_ALLREDUCES_FORWARD * model.layers * (
        cost.tp_allreduce(tokens * model.hidden * BF16_BYTES / chunks, tp) * chunks)
    return compute + reduce + chunks * pass_ops(model) * eff.op_latency_s


def decode_step_seconds(cost, model: ModelSpec, tp: int, batch: float) -> float:
    work, eff, device = cost.workload, cost.eff, cost.device
    context = work.prompt_len + work.mean_response_len / 2  # mean context while decoding
    kv_read = batch * context * model.kv_bytes_per_token / min(tp, model.kv_heads)
    read = BF16_BYTES * model.params / tp + kv_read
    memory_bound = read / (device.memory_bandwidth * eff.hbm_efficiency * eff.tp_factor(tp))
    compute_bound = forward_flops_per_token(model, context) * batch / (
        tp * device.bf16_flops * eff.mfu_decode * eff.tp_factor(tp))
    comm = TP_ALLREDUCES_FORWARD * model.layers * cost.tp_allreduce(
        batch * model.hidden * BF16_BYTES, tp)
    launches = (pass_ops(model) + SAMPLING_OPS) * eff.op_latency_s
    return max(memory_bound, compute_bound) + comm + eff.decode_step_overhead_s + launches


def switch_seconds(cost, model: ModelSpec, devices: int, layout: Layout) -> float:
    """Train -> generate once a step: engine wake-up plus all-gathering the rollout weights
    from the training shards (resharding)."""
    bandwidth, latency = cost.dp_link(devices)
    shard = BF16_BYTES * model.params / layout.tp
    return cost.eff.engine_switch_s + allgather_seconds(shard, layout.dp, bandwidth, latency)


def export_seconds(cost, role: str, devices: int) -> float:
    """The host's half of a weight sync: its bf16 weights gathered from the training
    shards on its `devices` devices, for sending (bucket by bucket)."""
    bandwidth, latency = cost.dp_link(devices)
    weights = BF16_BYTES * cost.problem.models[role].params
    return allgather_seconds(weights, devices, bandwidth, latency) + cost.eff.node_call_overhead_s


def load_seconds(cost, role: str) -> float:
    """The rollout's half: the whole bf16 model sent from the host's pool to this pool
    (a pipelined broadcast to its replicas costs about one copy), over NVLink on a
    one-node cluster, else over the NIC (the pools may sit on different nodes)."""
    eff, device = cost.eff, cost.device
    one_node = cost.cluster.nodes == 1
    bandwidth = (device.intra_node_bandwidth if one_node else device.inter_node_bandwidth)
    latency = eff.intra_node_latency_s if one_node else eff.inter_node_latency_s
    weights = BF16_BYTES * cost.problem.models[role].params
    return weights / (bandwidth * eff.link_efficiency) + latency + eff.node_call_overhead_s

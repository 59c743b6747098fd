"""Cost model: memory per device and seconds per node for one role's layout.

The runtime this models (docs/architecture.md) trains and scores with a training
backend (problem.TrainingBackend) and generates with a tensor-parallel rollout
engine, as verl does:
- `fsdp`: every train and forward pass runs ZeRO-3 over all n devices of the
  pool: weights (and grads and Adam states) are sharded n ways and gathered
  layer by layer for each micro-batch;
- `megatron`: tp x pp model parallel, dp = n / (tp pp) replicas, no re-gathers:
  tensor-parallel all-reduces inside each layer, a pipeline bubble, and one
  gradient all-reduce per optimizer step;
- optimizer offload keeps Adam and fp32 master weights in host memory (grads
  down and weights up over PCIe, Adam on the CPU); full offload also keeps the
  bf16 weights there (gathered from the host);
- a generating role additionally runs its rollout (rollout.py) as dp = n / tp
  replicas of tp devices. Its layout (dp, tp) is this rollout layout; a role
  that does not generate has layout (n, 1);
- sequence parallelism (`sp`, Ulysses; fsdp only, a generating role at tp=1): the
  role's train and forward passes split each row over sp ranks of dp = n / sp groups,
  each rank holding 1/sp of a micro-batch's tokens (activations and logits) and
  exchanging q, k, v and the attention output by all-to-all in every layer; the
  micro-batch budget is per rank, as verl's `ppo_max_token_len_per_gpu` is. A
  micro-batch holds whole rows, so a rank's peak holds at least one row's tokens / sp:
  what makes a long response need sp (`sp_options`).

Time and memory follow docs/placement.md. The efficiency constants live with
the device (efficiency.py); this module holds accounting facts only. Stateless
apart from the memo of role costs, which are pure functions of their keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridflow.core.kinds import NodeKind

from .devices import Cluster
from .formulas import (BF16_BYTES, FSDP_COLLECTIVES_FORWARD, FSDP_COLLECTIVES_TRAIN,
                       HOST_STATE_BYTES, OPTIMIZER_TRAFFIC_BYTES, SP_ALLTOALLS_FORWARD,
                       TP_ALLREDUCES_FORWARD,
                       TRAIN_PASS_FLOPS, TRAIN_STATE_BYTES, Layout, activation_bytes,
                       allgather_seconds, allreduce_seconds, forward_flops_per_token, pass_ops)
from .models import ModelSpec
from .problem import Problem, Workload
from .rollout import (batch_cap, export_seconds, generate_fixed_bytes, kv_bytes_per_sequence,
                      load_seconds, rollout_cost)

MEMORY_USABLE_FRACTION = 0.90  # CUDA context, NCCL buffers, fragmentation


@dataclass(frozen=True)
class RoleCost:
    """One role at one layout on n devices, independent of its pool mates."""

    role: str
    layout: Layout
    static_bytes: float
    transient_bytes: float  # peak over the role's non-generate nodes
    transient_node: str | None
    node_seconds: dict[str, float] = field(hash=False)  # non-generate nodes


def tp_options(cluster: Cluster, model: ModelSpec, devices: int, generates: bool) -> list[int]:
    """Rollout tensor-parallel sizes: powers of two inside a node dividing the pool and the heads.

    A role that does not generate has only one layout: tp=1.
    """
    if not generates:
        return [1]
    sizes, tp = [], 1
    while tp <= min(devices, cluster.gpus_per_node):
        if devices % tp == 0 and model.heads % tp == 0:
            sizes.append(tp)
        tp *= 2
    return sizes


def sp_sizes(cluster: Cluster, model: ModelSpec, devices: int) -> list[int]:
    """Sequence-parallel sizes above 1 a pool of `devices` allows for `model`, ascending:
    dividing the pool and the model's heads and key/value heads (each rank attends with
    whole heads), inside a node (the all-to-alls of every layer stay on its links)."""
    return [sp for sp in range(2, min(devices, cluster.gpus_per_node) + 1)
            if devices % sp == 0 and model.heads % sp == 0 and model.kv_heads % sp == 0]


def usable_bytes(cluster: Cluster) -> float:
    return cluster.spec.memory_bytes * MEMORY_USABLE_FRACTION


class CostModel:
    """Memoised costs for one problem; all methods are pure functions of their arguments."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.cluster = problem.cluster
        self.device = problem.cluster.spec
        self.eff = self.device.efficiency
        self.workload: Workload = problem.workload
        self.backend = problem.backend
        self.usable = usable_bytes(problem.cluster)
        self._roles: dict[tuple, RoleCost] = {}
        self._generate: dict[tuple, object] = {}

    # links: a tp group sits inside a node; dp collectives cross nodes when the pool does
    def dp_link(self, devices: int) -> tuple[float, float]:
        if devices > self.cluster.gpus_per_node:
            return (self.device.inter_node_bandwidth * self.eff.link_efficiency,
                    self.eff.inter_node_latency_s)
        return (self.device.intra_node_bandwidth * self.eff.link_efficiency,
                self.eff.intra_node_latency_s)

    def tp_allreduce(self, nbytes: float, tp: int) -> float:
        return allreduce_seconds(nbytes, tp, self.device.intra_node_bandwidth
                                 * self.eff.link_efficiency, self.eff.intra_node_latency_s)

    def model_parallel(self, devices: int) -> tuple[int, int]:
        """Training (tp, pp) on a pool: the backend's, shrunk to what the pool can hold."""
        if not self.backend.model_parallel:
            return 1, 1
        tp = min(self.backend.tp, devices, self.cluster.gpus_per_node)
        pp = max(1, min(self.backend.pp, devices // tp))
        return tp, pp

    def static_bytes(self, role: str, devices: int) -> float:
        model = self.problem.models[role]
        if role in self.problem.own_weights and not self.problem.trains(role):
            return 0.0  # an engine apart: its weights are its generate node's (rollout.py)
        if model.lora_rank and not self.problem.trains(role):
            return 0.0  # the LoRA actor with its adapters off serves it: no weights of its own
        if model.lora_rank:  # frozen bf16 base, full training state for the adapters only
            return (BF16_BYTES * model.params + TRAIN_STATE_BYTES * model.lora_params) / devices
        tp, pp = self.model_parallel(devices)
        sharded = model.params / devices  # fsdp: everything over n; megatron: states over n
        if not self.problem.trains(role):
            return BF16_BYTES * (model.params / (tp * pp) if tp * pp > 1 else sharded)
        offload = self.backend.offload
        weights_grads = 0.0 if offload == "all" else 2 * BF16_BYTES
        optimizer = HOST_STATE_BYTES if offload == "none" else 0.0  # else it lives on the host
        if tp * pp > 1:  # megatron: weights and grads per model shard, optimizer over dp
            return weights_grads * model.params / (tp * pp) + optimizer * sharded
        return (weights_grads + optimizer) * sharded

    def role_cost(self, role: str, devices: int, tp: int, sp: int = 1) -> RoleCost:
        key = (role, devices, tp, sp)
        if key not in self._roles:
            self._roles[key] = self._role_cost(role, devices, Layout.of(devices, tp, sp))
        return self._roles[key]

    def sp_options(self, role: str, devices: int, tp: int) -> list[int]:
        """Sequence-parallel sizes to weigh for `role`: 1, then (where the problem allows
        sp, the backend is fsdp, the role runs passes and generates at tp=1) the sizes
        `sp_sizes` allows, ascending, up to the first at which the role alone fits."""
        model = self.problem.models[role]
        kinds = {n.kind for n in self.problem.role_nodes(role)}
        if not self.problem.sequence_parallel or self.backend.model_parallel or tp > 1 or \
                not kinds & {NodeKind.TRAIN, NodeKind.INFERENCE} or model.lora_rank:
            return [1]
        options = [1]
        for sp in sp_sizes(self.cluster, model, devices):
            if self._fits_alone(self.role_cost(role, devices, tp, options[-1])):
                break
            options.append(sp)
        return options

    def _fits_alone(self, part: RoleCost) -> bool:
        return part.static_bytes + part.transient_bytes <= self.usable

    def _role_cost(self, role: str, devices: int, layout: Layout) -> RoleCost:
        seconds, peak, peak_node = {}, 0.0, None
        for node in self.problem.role_nodes(role):
            if node.kind.generates:
                continue
            if node.kind.moves_weights:  # weight sync of a rollout apart: no pass, no activations
                seconds[node.name] = self.sync_seconds(role, devices)
                continue
            train = node.kind.trains
            seconds[node.name], transient = self._pass(role, devices, train, layout.sp)
            if transient > peak:
                peak, peak_node = transient, node.name
        return RoleCost(role, layout, self.static_bytes(role, devices), peak, peak_node, seconds)

    def sync_seconds(self, role: str, devices: int) -> float:
        """A weight-sync node: the host exports (`role` trains), the rollout loads."""
        if self.problem.trains(role):
            return export_seconds(self, role, devices)
        return load_seconds(self, role)

    def micro_batches(self, sequences: float, sp: int = 1) -> tuple[int, float]:
        """(count, tokens each) for `sequences` on one replica (an sp group of `sp` ranks),
        packed up to micro_batch_tokens per rank."""
        tokens = sequences * self.workload.pass_seq_len
        count = max(1, math.ceil(tokens / (self.workload.micro_batch_tokens * sp)))
        return count, tokens / count

    def _pass(self, role: str, devices: int, train: bool, sp: int = 1) -> tuple[float, float]:
        """Seconds and transient bytes of one inference or train node."""
        work = self.workload
        tp, pp = self.model_parallel(devices)
        replicas = devices // (tp * pp * sp)
        seqs_per_replica = work.sequences / replicas
        steps = work.ppo_epochs * work.mini_batches if train else 1
        per_mini = seqs_per_replica / (work.mini_batches if train else 1)
        count, tokens = self.micro_batches(per_mini, sp)
        micro = self._micro_batch_seconds(role, devices, tokens / sp, train, sp)
        bubble = 1 + (pp - 1) / count  # pipeline fill and drain
        optimizer = self._optimizer_seconds(role, devices) if train else 0.0
        seconds = steps * (count * micro * bubble + optimizer) + self.eff.node_call_overhead_s
        held = tokens / sp
        if work.pass_seq_len > work.micro_batch_tokens:  # a row no micro-batch can cut
            held = max(held, work.pass_seq_len / sp)
        return seconds, activation_bytes(self.problem.models[role], held / tp, train)

    def _micro_batch_seconds(self, role: str, devices: int, tokens: float, train: bool,
                             sp: int = 1) -> float:
        model, eff = self.problem.models[role], self.eff
        tp, pp = self.model_parallel(devices)
        flops = forward_flops_per_token(model, self.workload.pass_seq_len) * tokens / (tp * pp)
        mfu = eff.mfu_train if train else eff.mfu_forward
        passes = TRAIN_PASS_FLOPS if train else 1
        compute = passes * flops / (self.device.bf16_flops * mfu * eff.tp_factor(tp))
        compute += passes * pass_ops(model) * eff.op_latency_s
        if tp * pp > 1:  # megatron: activations all-reduced inside each layer, nothing gathered
            layers = model.layers / pp
            reduce = self.tp_allreduce(tokens * model.hidden * BF16_BYTES, tp)
            return compute + (2 if train else 1) * TP_ALLREDUCES_FORWARD * layers * reduce
        collectives = FSDP_COLLECTIVES_TRAIN if train else FSDP_COLLECTIVES_FORWARD
        bandwidth, latency = self.dp_link(devices)
        gathers = collectives * allgather_seconds(BF16_BYTES * model.params, devices, bandwidth,
                                                  latency)
        if self.backend.offload == "all":  # every gather first pulls the shard from the host
            gathers += collectives * BF16_BYTES * model.params / devices / (
                self.device.host_bandwidth)
        # Ulysses' all-to-alls sit between a layer's projections and its attention: on
        # the critical path, not overlapped (`tokens`: this rank's)
        exchange = (2 if train else 1) * SP_ALLTOALLS_FORWARD * model.layers * allgather_seconds(
            tokens * model.hidden * BF16_BYTES, sp,
            self.device.intra_node_bandwidth * eff.link_efficiency, eff.intra_node_latency_s)
        return max(compute, gathers) + exchange  # FSDP prefetch overlaps gathers with compute

    def _optimizer_seconds(self, role: str, devices: int) -> float:
        """One optimizer step: Adam over the local states, plus the gradient all-reduce
        (megatron) or the host round trip (offload)."""
        model = self.problem.models[role]
        shard = model.params / devices
        tp, pp = self.model_parallel(devices)
        seconds = 0.0
        if tp * pp > 1:
            bandwidth, latency = self.dp_link(devices)
            seconds += allreduce_seconds(BF16_BYTES * model.params / (tp * pp),
                                         devices // (tp * pp), bandwidth, latency)
        if self.backend.offload == "none":
            return seconds + OPTIMIZER_TRAFFIC_BYTES * shard / (
                self.device.memory_bandwidth * self.eff.hbm_efficiency)
        host_trip = 2 * BF16_BYTES * shard / self.device.host_bandwidth  # grads down, weights up
        return seconds + host_trip + shard / self.eff.host_adam_params_per_s

    # --- generation: rollout.py --------------------------------------------
    def generate_fixed_bytes(self, role: str, tp: int) -> float:
        return generate_fixed_bytes(self.problem.models[role], tp)

    def kv_bytes_per_sequence(self, role: str, tp: int) -> float:
        return kv_bytes_per_sequence(self.problem.models[role], self.workload, tp)

    def generate_cost(self, role: str, devices: int, tp: int, free_bytes: float):
        """Rollout time given the memory left by the pool's static state (rollout.GenerateCost);
        None if no sequence fits."""
        cap = batch_cap(self.problem.models[role], self.workload, tp, free_bytes)
        key = (role, devices, tp, cap)
        if key not in self._generate:
            self._generate[key] = rollout_cost(self, role, devices, Layout.of(devices, tp), cap)
        return self._generate[key]

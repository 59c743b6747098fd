"""Accounting facts and formulas shared by the training (cost.py) and rollout (rollout.py)
costs: bytes per parameter, FLOPs per token, operator launches, collectives. Stateless.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.core.layout import RoleLayout

from .models import BF16_BYTES, ModelSpec

MAX_DECODE_BATCH = 256  # sequences decoded at once per replica (vLLM max_num_seqs)
PREFILL_CHUNK_TOKENS = 8192  # tokens per prefill chunk (workspace memory)

# --- accounting facts -------------------------------------------------------
TRAIN_STATE_BYTES = 16  # bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam 8
HOST_STATE_BYTES = 12  # fp32 master and Adam moments, on the host when offloaded
OPTIMIZER_TRAFFIC_BYTES = 32  # Adam reads and writes every state once a step
TRAIN_PASS_FLOPS = 4  # forward + backward (2x) + recomputed forward (checkpointing)
TP_ALLREDUCES_FORWARD = 2  # per layer: after attention and after the MLP
# per layer under sequence parallelism (Ulysses): q, k, v to heads, the output back;
# one all-to-all moves what an all-gather of the same bytes does ((sp-1)/sp of them)
SP_ALLTOALLS_FORWARD = 4
FSDP_COLLECTIVES_TRAIN = 3  # per micro-batch: gather fwd, gather bwd, reduce-scatter
FSDP_COLLECTIVES_FORWARD = 1  # per micro-batch: gather fwd
ACTIVATION_BYTES_TRAIN = 34  # per token per hidden unit of one layer (Korthikanti et al.)
ACTIVATION_BYTES_FORWARD = 16  # live forward buffers per token per hidden unit
LOGIT_BYTES = 4  # fp32 logits per vocab entry (x2 in training for their grad)
OPS_PER_LAYER = 40  # eager operator launches of one decoder layer's forward
OPS_PER_PASS = 20  # embedding, final norm, head, log-softmax and gathers


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    sp: int = 1  # sequence-parallel ranks splitting a row in the role's passes (not generation)

    @classmethod
    def of(cls, devices: int, tp: int, sp: int = 1) -> "Layout":
        """The layout of `devices` ranks at tensor-parallel size `tp` and sequence-parallel
        size `sp`, derived by the role layout (`core/layout.RoleLayout`), as the workers
        will build it."""
        return cls(RoleLayout(devices, tp, sp).dp, tp, sp)

    def parallel_config(self) -> dict:
        """`placement.parallel.<role>` of this layout (sp only where it is on)."""
        return {"dp": self.dp, "tp": self.tp, **({"sp": self.sp} if self.sp > 1 else {})}


def forward_flops_per_token(model: ModelSpec, context: float) -> float:
    # 2 FLOPs per parameter plus causal attention over `context` tokens.
    return 2 * model.params + 2 * model.layers * context * model.heads * model.head_dim


def pass_ops(model: ModelSpec) -> int:
    """Operator launches of one forward pass: what a pass costs beyond FLOPs and bytes."""
    return model.layers * OPS_PER_LAYER + OPS_PER_PASS


def allreduce_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + latency


def allgather_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bandwidth + latency


def activation_bytes(model: ModelSpec, tokens: float, train: bool) -> float:
    """Transient bytes of one micro-batch of `tokens` tokens on one device."""
    logits = tokens * model.vocab * LOGIT_BYTES
    if train:  # checkpointed layer inputs + one layer recomputed + logits and their grad
        acts = tokens * model.hidden * (model.layers * BF16_BYTES + ACTIVATION_BYTES_TRAIN)
        logits *= 2
    else:
        acts = tokens * model.hidden * ACTIVATION_BYTES_FORWARD
    # two FSDP units (layers) gathered at once, with their grads in training
    layer = BF16_BYTES * model.params / model.layers
    return acts + logits + 2 * layer * (2 if train else 1)

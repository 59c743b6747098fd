"""Tensor parallelism of a Hugging Face decoder (causal LM, value or classification model)
with DTensor plans over the "tp" dimension of a role's device mesh.

The plan for the decoder layers is the model class's own transformers plan
(`config.base_model_tp_plan`; Llama and Qwen2: q/k/v/gate/up "colwise", o/down
"rowwise"), else the project's plan for the Llama layout (`LLAMA_PLAN`), translated to
torch's `ColwiseParallel` / `RowwiseParallel`. Attention reshapes its projections with
-1 heads (transformers 5.24), so each rank runs its own whole heads. Beyond the layers:
- the input embedding: `RowwiseParallel`, vocabulary rows sharded, its output
  all-reduced to every rank of the group;
- the output head (`lm_head`): `ColwiseParallel` with its output kept a DTensor
  sharded on the vocabulary (`Shard(-1)`), which the vocab-parallel log-probs read
  without gathering (`workers/parallel/vocab_parallel.py`); `full_logits(module)` gathers it for
  code that needs whole logits (sampling);
- a tied head (SmolLM2) is re-tied to the sharded embedding: one sharded weight;
- everything else (norms, a value head) stays a plain tensor, the same on every rank
  of the group, and so does its gradient (the group computes one replicated loss).
Gradients are never averaged over the tp ranks; a backend averages them over dp only.
State: none beyond the modules it rewrites (and a `_hybridflow_tp` mark on the root).
"""
from __future__ import annotations

import fnmatch
import math
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hybridflow.core.dtensor import local_shard, whole_tensor

__all__ = ["LLAMA_PLAN", "TRANSLATED", "WHOLE", "layer_plan", "tensor_parallel_plan",
           "parallelize", "is_tensor_parallel", "full_logits",
           "clip_grad_norm", "refuse_lora"]

# the Llama family's layout (Llama, Qwen2, Mistral, ...): what transformers ships for
# them, used when a model class ships no plan
LLAMA_PLAN = {
    "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}
_OWN_PLANS = {"llama": LLAMA_PLAN, "qwen2": LLAMA_PLAN, "mistral": LLAMA_PLAN}
_MARK = "_hybridflow_tp"


# transformers' plan styles (transformers' ALL_PARALLEL_STYLES registry, and the
# integrations module of earlier releases) as the worker applies them: torch's DTensor
# styles with the same layouts, or WHOLE: kept whole on every rank, which is what the
# worker does with any module no plan names (norms, a value head); the input
# embedding and the output head are sharded by `parallelize` itself, whatever the
# plan says of them. A plan using any other style (packed or expert-parallel layouts)
# gives way to the project's own plan for its model type, or is refused.
WHOLE = ("replicate", "sequence_parallel", "replicated_with_grad_allreduce")


def _styles() -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {
        "colwise": ColwiseParallel, "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate(),
                                                     output_layouts=Replicate()),
        "embedding_colwise": lambda: ColwiseParallel(input_layouts=Replicate(),
                                                     output_layouts=Replicate()),
    }


TRANSLATED = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output", "rowwise_rep",
              "rowwise_split_input", "embedding_rowwise", "embedding_colwise") + WHOLE


def layer_plan(model: torch.nn.Module) -> dict[str, str]:
    """Module path (relative to the base model, `*` for any layer) -> a style name of
    TRANSLATED: the model class's plan, or the project's for its model type when the
    class ships none or uses a style not translated; ValueError naming the model and
    the styles when neither can be used."""
    config = getattr(model, "config", None)
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    kind = getattr(config, "model_type", type(model).__name__)
    own = dict(_OWN_PLANS.get(kind, {}))
    untranslated = sorted({str(s) for s in plan.values()} - set(TRANSLATED))
    if plan and not untranslated:
        return plan
    if own:
        return own
    if plan:
        raise ValueError(f"model type {kind!r}: its tensor-parallel plan "
                         f"(config.base_model_tp_plan) uses style(s) {untranslated}, which "
                         f"hybridflow does not translate (it translates: "
                         f"{', '.join(TRANSLATED)}), and hybridflow has no plan of its own "
                         f"for it (it has: {sorted(_OWN_PLANS)}); set "
                         f"placement.parallel.<role>.tp=1")
    raise ValueError(f"model type {kind!r} ships no tensor-parallel plan "
                     f"(config.base_model_tp_plan) and hybridflow has none for it "
                     f"(it has: {sorted(_OWN_PLANS)}); set placement.parallel.<role>.tp=1")


def _expand(base: torch.nn.Module, plan: dict[str, str], own: set[str]) -> dict[str, object]:
    """The plan with its `*` patterns matched against the base model's modules; the
    modules in `own` (embedding, head: sharded by `parallelize`) and WHOLE ones left."""
    names = [name for name, _ in base.named_modules() if name]
    styles, make = {}, _styles()
    for pattern, kind in plan.items():
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)
                and n.count(".") == pattern.count(".")]
        for name in hits:
            if kind not in WHOLE and name not in own:
                styles[name] = make[kind]()
    if not styles:
        raise ValueError(f"the tensor-parallel plan {sorted(plan)} matched no module of "
                         f"{type(base).__name__}")
    return styles


def _ends(model: torch.nn.Module):
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return embed, head


def tensor_parallel_plan(model: torch.nn.Module) -> dict[str, object]:
    """Base-model module name -> the DTensor style the worker applies to it (the
    layers; `parallelize` adds the embedding and the head). What `check` runs on a
    model built on the meta device, so a plan the worker would refuse is refused
    before launch (program/parallel_checks.py)."""
    base = getattr(model, "base_model", model)
    ends = {m for m in _ends(model) if m is not None}
    own = {name for name, module in base.named_modules() if module in ends}
    return _expand(base, layer_plan(model), own)


def parallelize(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """Shard `model` in place over the 1-D device mesh `mesh` (the role's "tp" dim). A
    model already sharded (built shard by shard, `shard_build.py`) is left as it is.
    Works on the meta device too: the parameters become meta DTensors."""
    if is_tensor_parallel(model):
        return model
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    base = getattr(model, "base_model", model)
    trainable = {n: p.requires_grad for n, p in model.named_parameters(remove_duplicate=False)}
    embed, head = _ends(model)
    tied = head is not None and embed is not None and head.weight is embed.weight
    parallelize_module(base, mesh, tensor_parallel_plan(model))
    if embed is not None:
        parallelize_module(embed, mesh, RowwiseParallel(input_layouts=Replicate(),
                                                        output_layouts=Replicate()))
    if head is not None:
        parallelize_module(head, mesh, ColwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False))
        if tied:  # both shard vocabulary rows (Shard(0)): the head reuses the embedding's
            head.weight = embed.weight
    for name, param in model.named_parameters(remove_duplicate=False):
        param.requires_grad_(trainable.get(name, param.requires_grad))
    setattr(model, _MARK, True)
    return model


def is_tensor_parallel(module: torch.nn.Module) -> bool:
    return bool(getattr(module, _MARK, False))


@contextmanager
def full_logits(module: torch.nn.Module):
    """Within: the head of a tensor-parallel `module` returns whole logits (a plain
    tensor, the same on every rank of the group), for sampling. Elsewhere a no-op."""
    head = module.get_output_embeddings() if is_tensor_parallel(module) else None
    if head is None:
        yield module
        return

    def gather(_mod, _inputs, output):
        return whole_tensor(output)

    handle = head.register_forward_hook(gather)
    try:
        yield module
    finally:
        handle.remove()


def _share(grad) -> float:
    """Weight of this rank's sum of squares in the world's sum: 1 / the number of ranks
    holding the same values (replicated mesh dims, and ranks outside a sub-mesh)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not hasattr(grad, "device_mesh"):
        return 1.0 / world
    mesh = grad.device_mesh
    copies = world / mesh.size()
    for dim, placement in enumerate(grad.placements):
        if placement.is_replicate():
            copies *= mesh.size(dim)
    return 1.0 / copies


def clip_grad_norm(params, max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` over a mix of DTensor (sharded, on sub-meshes)
    and plain (replicated) gradients: each rank sums the squares of what it holds,
    weighted so a value held by k ranks counts once, one all-reduce over the world."""
    from torch.distributed.tensor import Replicate
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.zeros((), dtype=torch.float64)
    for grad in grads:
        if hasattr(grad, "placements") and any(p.is_partial() for p in grad.placements):
            grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p
                                                 for p in grad.placements])
        local = local_shard(grad)
        total += local.detach().double().pow(2).sum().cpu() * _share(grad)
    if dist.is_initialized():
        device = grads[0].device if grads and grads[0].device.type == "cuda" else "cpu"
        total = total.to(device)
        dist.all_reduce(total)
    norm = math.sqrt(float(total))
    coef = min(1.0, max_norm / (norm + 1e-6)) if math.isfinite(norm) else 1.0
    if coef < 1.0:
        for grad in grads:
            grad.mul_(coef)
    return norm


def refuse_lora(role: str, tp: int, lora_rank: int) -> None:
    """LoRA adapters on a tensor-parallel model are not sharded by any plan here."""
    if tp > 1 and lora_rank > 0:
        raise ValueError(
            f"placement.parallel.{role}.tp={tp} with actor.lora.rank={lora_rank}: LoRA "
            "adapters on a tensor-parallel model are not supported (the peft-wrapped "
            "projections have no tensor-parallel plan); set actor.lora.rank=0 to train the "
            "full model at tp>1, or placement.parallel." + role + ".tp=1 to train LoRA")

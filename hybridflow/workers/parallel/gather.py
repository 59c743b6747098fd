"""The bucketed gather: a trained module's weights, unsharded one tensor at a time and
handed out in buckets of at most `bucket_bytes`, so that no rank ever holds a second
whole copy of the model.

    plan = weight_plan(module, bucket_bytes)       # names, dtypes, shapes: no gather
    for bucket in gathered_buckets(module, plan):  # [(plain HF name, full tensor)]
        engine.load_weights(bucket)                # then drop it before the next

Walks `module.state_dict(keep_vars=True)` in order (the same order on every rank):
- a DTensor (FSDP2's Shard(0), tensor parallelism's Shard/Replicate on a 2-D mesh:
  any placement) is unsharded with `full_tensor()` of that tensor alone, which is a
  collective: every rank of the training group iterates the same plan in lockstep,
  and a rank that does not keep the result (`keep=False`) drops it at once;
- a tensor tied to an earlier one (the same Parameter under two names, e.g. a tied
  embedding and LM head) is sent once, under its first name: the receiver's model
  ties it;
- a LoRA layer's base weight is sent merged (W + scale * B @ A, computed per layer
  from the gathered factors in float32), and the factors themselves are not sent.
Names are plain Hugging Face names (`plain_weight_name`: no DDP/compile/peft
wrappers). Stateless.

The peak per rank is the bucket being filled plus the tensor being gathered (and,
for a LoRA layer, its two small factors); the caller drops a bucket before asking
for the next, so a sync's transient memory is about two buckets.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Iterator

import torch

from hybridflow.core.dtensor import whole_tensor

__all__ = ["WeightEntry", "WeightPlan", "plain_weight_name", "weight_plan",
           "gathered_buckets", "full_tensor", "tensor_bytes"]

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "base_model.model.")


def plain_weight_name(name: str) -> str | None:
    """A training parameter name -> its plain Hugging Face checkpoint name (None: not
    a weight an engine loads, e.g. an unmerged LoRA factor)."""
    if "lora_" in name:
        return None
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name.replace(".base_layer.", ".").replace("._orig_mod.", ".")


@dataclass(frozen=True)
class WeightEntry:
    """One tensor a receiver gets: its plain name, the state-dict key it is read from,
    and its full (global) dtype and shape."""
    name: str
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class WeightPlan:
    """The entries in state-dict order, cut into buckets ([first, end) entry ranges)
    of at most `bucket_bytes` (a tensor larger than that gets a bucket of its own)."""
    entries: list[WeightEntry] = field(default_factory=list)
    buckets: list[tuple[int, int]] = field(default_factory=list)
    bucket_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _lora_factors(module: torch.nn.Module) -> dict[str, tuple[str, str, float, bool]]:
    """state-dict key of each LoRA base weight -> (A key, B key, scale, fan_in_fan_out)."""
    # a module holds LoRA layers only if peft was imported to make them; importing it
    # here otherwise cost each process's first sync ~0.2 s (bench/weight_sync.py --ray)
    lora = sys.modules.get("peft.tuners.lora")
    if lora is None:
        return {}
    LoraLayer = lora.LoraLayer
    out = {}
    for name, layer in module.named_modules():
        if isinstance(layer, LoraLayer) and "default" in layer.lora_A:
            out[f"{name}.base_layer.weight"] = (
                f"{name}.lora_A.default.weight", f"{name}.lora_B.default.weight",
                float(layer.scaling["default"]), bool(getattr(layer, "fan_in_fan_out", False)))
    return out


def weight_plan(module: torch.nn.Module, bucket_bytes: int, rename=plain_weight_name
                ) -> WeightPlan:
    """What `gathered_buckets` will hand out, from shapes alone (no collective)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes} "
                         f"(rollout.weight_bucket_mb)")
    plan, seen = WeightPlan(bucket_bytes=bucket_bytes), set()
    for key, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # tied: the receiver's model ties it
            continue
        seen.add(id(tensor))
        name = rename(key)
        if name is not None:
            plan.entries.append(WeightEntry(name, key, tensor.dtype, tuple(tensor.shape)))
    first, size = 0, 0
    for i, entry in enumerate(plan.entries):
        if i > first and size + entry.nbytes > bucket_bytes:
            plan.buckets.append((first, i))
            first, size = i, 0
        size += entry.nbytes
    if plan.entries:
        plan.buckets.append((first, len(plan.entries)))
    return plan


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of one tensor: `full_tensor()` of a DTensor (collective over its mesh,
    whatever its placements), the tensor itself otherwise. Detached."""
    tensor = tensor.detach()
    return whole_tensor(tensor)


@torch.no_grad()
def _merged(state: dict, key: str, factors: tuple[str, str, float, bool]) -> torch.Tensor:
    a_key, b_key, scale, fan_in_fan_out = factors
    base = full_tensor(state[key])
    delta = full_tensor(state[b_key]).float() @ full_tensor(state[a_key]).float()
    if fan_in_fan_out:
        delta = delta.T
    return (base.float() + delta * scale).to(base.dtype)


def gathered_buckets(module: torch.nn.Module, plan: WeightPlan, keep: bool = True,
                     device: str | torch.device | None = None
                     ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """One bucket of (name, full tensor) per step of `plan`. Collective when the
    module is sharded: every rank iterates to the end; with `keep=False` a rank
    gathers and drops at once (its buckets are empty lists). `device`: where the
    tensors go ("cpu" for a receiver in another process; None leaves them where the
    gather put them). Tensors of an unsharded module on that device are the module's
    own (no copy): the receiver copies them out before the next step."""
    state = module.state_dict(keep_vars=True)
    lora = _lora_factors(module)
    for first, end in plan.buckets:
        bucket = []
        for entry in plan.entries[first:end]:
            tensor = _merged(state, entry.key, lora[entry.key]) if entry.key in lora \
                else full_tensor(state[entry.key])
            if keep:
                bucket.append((entry.name, tensor if device is None else tensor.to(device)))
            del tensor
        yield bucket
        del bucket

"""Moving a policy's weights from the actor to a rollout engine: what travels on the
weight-sync edge of a plan (`actor.export_weights` -> `rollout.load_weights`).

The export is a one-row Batch with two columns, so it moves like any node output
(on Ray: an object reference from the actor's rank 0 to every rollout rank, never
through the driver):
- `weights`: every tensor's bytes in one flat uint8 buffer [1, nbytes];
- `weight_index`: a `WeightIndex` (names, dtypes, shapes, byte offsets, buckets and
  the policy version), from which the receiver takes per-bucket views: the engine
  loads bucket by bucket and never needs a second full copy.
Names are plain Hugging Face names (no DDP/compile/peft wrappers); a LoRA policy
is exported merged (W + scaled B·A under the base names).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from hybridflow.core.batch import Batch

__all__ = ["WEIGHT_KEYS", "WeightIndex", "plain_weight_name", "policy_weights",
           "pack_weights", "weight_buckets", "refresh_engine", "load_export"]

WEIGHT_KEYS = ("weights", "weight_index")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "base_model.model.")
_ALIGN = 16  # bytes: every tensor starts aligned, so a dtype view of its slice is legal


@dataclass
class WeightIndex:
    version: int
    names: list[str] = field(default_factory=list)
    dtypes: list[torch.dtype] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)   # byte offset of each tensor
    buckets: list[tuple[int, int]] = field(default_factory=list)  # [first, end) tensors
    nbytes: int = 0


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


def policy_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy `module` computes, as plain names -> tensors (LoRA merged; FSDP
    shards gathered, which is collective: every rank must call it)."""
    from hybridflow.workers.lora import is_lora, merged_state_dict
    from hybridflow.workers.training import full_state_dict
    sharded = any(hasattr(p, "full_tensor") for p in module.parameters())
    raw = merged_state_dict(module) if is_lora(module) else \
        full_state_dict(module) if sharded else module.state_dict()
    out = {}
    for name, tensor in raw.items():
        plain = plain_weight_name(name)
        if plain is not None:
            out[plain] = tensor.detach()
    return out


def pack_weights(weights: dict[str, torch.Tensor], version: int,
                 bucket_bytes: int) -> Batch:
    """The export Batch of `weights` (see the module docstring); tied tensors that
    share a storage are sent once per name (the receiver copies into each)."""
    index = WeightIndex(version)
    offset, first, bucket_start = 0, 0, 0
    for i, (name, tensor) in enumerate(weights.items()):
        nbytes = tensor.numel() * tensor.element_size()
        if i > first and offset + nbytes - bucket_start > bucket_bytes:
            index.buckets.append((first, i))
            first, bucket_start = i, offset
        index.names.append(name)
        index.dtypes.append(tensor.dtype)
        index.shapes.append(tuple(tensor.shape))
        index.offsets.append(offset)
        offset += -(-nbytes // _ALIGN) * _ALIGN
    if index.names:
        index.buckets.append((first, len(index.names)))
    index.nbytes = offset
    flat = torch.zeros(offset, dtype=torch.uint8)
    for tensor, start in zip(weights.values(), index.offsets):
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        flat[start:start + data.numel()] = data
    return Batch({"weights": flat.unsqueeze(0)}, {"weight_index": [index]})


def weight_buckets(export: Batch) -> tuple[WeightIndex, Iterator[list[tuple[str, torch.Tensor]]]]:
    """The index of an export and an iterator over its buckets of (name, tensor)
    views into the received buffer (no copy until the engine loads them)."""
    if len(export) != 1 or "weights" not in export or "weight_index" not in export:
        raise ValueError("load_weights needs the one-row output of actor.export_weights "
                         f"(columns {list(WEIGHT_KEYS)}), got {len(export)} row(s) with "
                         f"columns {export.keys()}")
    index: WeightIndex = export["weight_index"][0]
    flat = export["weights"][0]

    def tensor(i: int) -> torch.Tensor:
        dtype, shape, start = index.dtypes[i], index.shapes[i], index.offsets[i]
        count = 1
        for dim in shape:
            count *= dim
        size = count * torch.empty((), dtype=dtype).element_size()
        return flat[start:start + size].view(dtype).view(shape)

    def buckets():
        for first, end in index.buckets:
            yield [(index.names[i], tensor(i)) for i in range(first, end)]
    return index, buckets()


def _grouped(weights: dict[str, torch.Tensor], bucket_bytes: int):
    bucket, size = [], 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def refresh_engine(engine, module: torch.nn.Module, version: int, bucket_bytes: int) -> float:
    """Make a colocated engine hold `module`'s weights at `version`, in this process;
    returns the seconds spent (0 for an engine that generates with `module` itself)."""
    if engine.shares_module:
        engine.policy_version = version
        return 0.0
    start = time.perf_counter()
    engine.wake_up()
    if engine.policy_version != version:
        for bucket in _grouped(policy_weights(module), bucket_bytes):
            engine.load_weights(bucket)
        engine.finish_weight_update(version)
    return time.perf_counter() - start


def load_export(engine, export: Batch) -> tuple[WeightIndex, float]:
    """Load a received export into `engine`, bucket by bucket; returns its index and
    the seconds the load took (the real load, synchronised by the engine)."""
    start = time.perf_counter()
    index, buckets = weight_buckets(export)
    engine.wake_up()
    for bucket in buckets:
        engine.load_weights(bucket)
    engine.finish_weight_update(index.version)
    return index, time.perf_counter() - start

"""The one place that asks whether a tensor is a DTensor (sharded over a device mesh:
tensor parallelism, FSDP2) and turns it into what a caller needs. Everything else
calls these three instead of probing `to_local` / `full_tensor` itself.

- `is_sharded(t)`: a DTensor (it has a mesh and placements);
- `local_shard(t)`: this rank's part of it (no communication); a plain tensor itself;
- `whole_tensor(t)`: the global value (a collective over the tensor's mesh: every rank
  of the mesh must call it, in the same order); a plain tensor itself.

Duck-typed on purpose: importing torch.distributed.tensor is not needed to ask, and a
plain tensor never pays for it. State: none.
"""
from __future__ import annotations

from typing import Any

__all__ = ["is_sharded", "local_shard", "whole_tensor"]


def is_sharded(tensor: Any) -> bool:
    """Whether `tensor` is a DTensor (a shard of a value spread over a mesh)."""
    return hasattr(tensor, "to_local") and hasattr(tensor, "full_tensor")


def local_shard(tensor: Any) -> Any:
    """This rank's local part of a DTensor (no collective), else the tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def whole_tensor(tensor: Any) -> Any:
    """The whole value of a DTensor (a collective over its mesh), else the tensor."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor

"""The training-backend protocol, with the behaviour shared by the backends.

A backend is built once per trained module and keeps only its settings (world size,
device, compute dtype, and for a tensor-parallel role its (dp, tp) device mesh) and,
after `wrap`, what it wrapped. `world` counts data-parallel ranks (a tp group is one).
What a backend class declares, read by pre-flight and the memory model instead of its
name: `tensor_parallel` (it can shard its module over a role mesh's "tp" dimension,
`parallel/tensor_parallel.py`; pre-flight refuses tp > 1 with any other), `shards` (parameters,
gradients and optimizer state split over the data-parallel ranks), `gradient_buckets`
(gradients also sit in all-reduce buckets when world > 1) and, optionally, `requires`
(modules it imports, checked by `hybridflow check`). Master weights and optimizer state
stay in the module's dtype (float32); `autocast()` is where the forward computes in
`compute_dtype` (bfloat16 when `model.dtype=bf16`).
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from hybridflow.core.dtensor import whole_tensor
from hybridflow.core.layout import refuse_not_tensor_parallel
from hybridflow.workers.parallel.tensor_parallel import clip_grad_norm, is_tensor_parallel
from hybridflow.workers.weights import full_state_dict, load_full_state_dict

__all__ = ["TrainingBackend"]


class TrainingBackend:
    """wrap -> forward under `autocast()` -> `sync_context` per micro-batch ->
    `clip_grad_norm` -> optimizer step; `full_state_dict` / `load_full_state_dict` for
    weights, `save_optimizer` / `load_optimizer` for the optimizer (sharded where the
    backend shards)."""
    name = "base"
    shards = False  # parameters and optimizer state are split over the ranks
    # gradients also sit in all-reduce buckets when world > 1 (DDP): the memory model
    # counts them from this declaration (memory/roles.py)
    gradient_buckets = False
    requires: tuple[str, ...] = ()  # modules building it imports (`hybridflow check`)
    tensor_parallel = False  # wrap() can shard over the "tp" dim of a role mesh

    def __init__(self, world: int, device: torch.device,
                 compute_dtype: torch.dtype = torch.float32, mesh=None):
        self.world, self.device, self.compute_dtype = world, device, compute_dtype
        if mesh is not None and not self.tensor_parallel:
            refuse_not_tensor_parallel("training strategy", "<role>.strategy", self.name,
                                       _tensor_parallel_names(TrainingBackend))
        self.role_mesh = mesh  # (dp, tp) DeviceMesh of a tensor-parallel role, else None

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """What forward and backward go through (the module itself, or a wrapper)."""
        return module

    def autocast(self):
        """Context of every forward: low-precision compute over float32 weights."""
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def sync_context(self, model, last: bool):
        """Context of one micro-batch's backward: sync gradients only on the last."""
        return nullcontext()

    def clip_grad_norm(self, module: torch.nn.Module, max_norm: float) -> float:
        params = [p for p in module.parameters() if p.requires_grad]
        if is_tensor_parallel(module):  # DTensor and plain gradients, on several meshes
            return clip_grad_norm(params, max_norm)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(whole_tensor(norm))

    def full_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return full_state_dict(module)

    def load_full_state_dict(self, module: torch.nn.Module, weights: dict) -> None:
        load_full_state_dict(module, weights)

    # ------------------------------------------------------------- optimizer
    def optimizer_file(self, directory: str, rank: int) -> str:
        return os.path.join(directory, f"optim_rank{rank}.pt")

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """This rank's optimizer state, as plain tensors `torch.save` can write."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


def _tensor_parallel_names(cls) -> list[str]:
    """Names of the backend classes below `cls` that shard by tensor parallelism (the
    registry imports this module, so it is not asked here)."""
    out = []
    for sub in cls.__subclasses__():
        out += ([sub.name] if sub.tensor_parallel else []) + _tensor_parallel_names(sub)
    return sorted(set(out))

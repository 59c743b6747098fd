"""Training backends by name: how a trained module is wrapped for data parallelism,
where its forward computes in low precision, how gradients sync, and how its weights
and optimizer state are gathered, saved and loaded.

State: `BACKENDS`, name -> backend class; `ddp` and `fsdp2` register here, and a new
one (Megatron, ...) registers with `register_backend` without touching the trainer.
The trainer reads the name from `actor.strategy` / `critic.strategy`. A backend class
that shards by tensor parallelism says `tensor_parallel = True` (fsdp2; ddp does not):
pre-flight refuses `placement.parallel.<role>.tp > 1` with any other, and `make_backend`
hands such a backend the role's (dp, tp) mesh (`parallel/tensor_parallel.py` shards over "tp").
"""
from __future__ import annotations

import torch

from hybridflow.core.layout import refuse_not_tensor_parallel
from hybridflow.workers.backends.base import TrainingBackend
from hybridflow.workers.backends.ddp import DDPBackend
from hybridflow.workers.backends.fsdp2 import FSDP2Backend

__all__ = ["TrainingBackend", "BACKENDS", "register_backend", "make_backend"]

BACKENDS: dict[str, type[TrainingBackend]] = {}


def register_backend(name: str, cls: type[TrainingBackend]) -> None:
    BACKENDS[name] = cls


def make_backend(name: str, world: int, device: torch.device,
                 compute_dtype: torch.dtype = torch.float32, mesh=None) -> TrainingBackend:
    """The backend registered as `name`; ValueError listing the valid names. `mesh`:
    a tensor-parallel role's (dp, tp) DeviceMesh (`world` is then its dp)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown training strategy {name!r} (actor.strategy / "
                         f"critic.strategy); valid names: {', '.join(sorted(BACKENDS))}")
    if mesh is None:  # a backend registered before meshes existed takes three arguments
        return BACKENDS[name](world, device, compute_dtype)
    if not getattr(BACKENDS[name], "tensor_parallel", False):
        refuse_not_tensor_parallel(
            "training strategy", "<role>.strategy", name,
            [n for n, cls in BACKENDS.items() if getattr(cls, "tensor_parallel", False)])
    return BACKENDS[name](world, device, compute_dtype, mesh=mesh)


register_backend("ddp", DDPBackend)
register_backend("fsdp2", FSDP2Backend)

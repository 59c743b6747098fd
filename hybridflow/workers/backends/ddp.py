"""DDP: every rank holds the whole module; gradients are averaged after backward.

Stateless beyond its settings. One rank (or no process group) trains the bare
module; on CUDA the wrapper pins the rank's device.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from hybridflow.workers.backends.base import TrainingBackend

__all__ = ["DDPBackend"]


class DDPBackend(TrainingBackend):
    name = "ddp"
    tensor_parallel = False  # DDP replicates whole modules; use fsdp2 for tp > 1
    gradient_buckets = True  # DistributedDataParallel's all-reduce buckets
    requires = ("torch.distributed",)

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def sync_context(self, model, last: bool):
        if self.world == 1 or last:
            return nullcontext()
        return model.no_sync()

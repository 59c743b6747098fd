"""Where a worker runs: its rank, world size, device, seed and the roles colocated with it
in the same process. The runtime builds one per worker; a worker keeps it. Stateless
beyond the dataclass itself; `init_distributed` joins torch.distributed's default group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["WorkerContext"]


@dataclass
class WorkerContext:
    """Where a worker runs. The runtime fills it; tests use the defaults (one CPU rank).

    colocated: role -> the other worker instances living in this process (the
    runtime fills it after constructing them all), e.g. so a rollout engine can
    share the actor's weights.
    """
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str | None = None          # None: decided by the model config ("auto")
    seed: int = 0
    colocated: dict[str, Any] = field(default_factory=dict)

    def backend(self) -> str:
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        return "nccl" if device.startswith("cuda") else "gloo"

    def init_distributed(self) -> None:
        """Join the default process group (from RANK, WORLD_SIZE, MASTER_ADDR,
        MASTER_PORT) when world_size > 1 and it is not initialised yet."""
        if self.world_size <= 1 or (dist.is_available() and dist.is_initialized()):
            return
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(f"world_size={self.world_size} needs the env vars {missing} "
                               "set by the runtime before the workers are constructed")
        if self.backend() == "nccl":
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(self.backend(), rank=self.rank, world_size=self.world_size)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

"""Where a worker runs: its rank, world size, device, seed, its role's tensor-parallel
size and the roles colocated with it in the same process. The runtime builds one per
worker; a worker keeps it. `init_distributed` joins torch.distributed's default group.

The role's layout is `layout` (`core/layout.RoleLayout`): a pool of `world_size` ranks
runs dp groups of `tp` ranks, rank r's coordinates are `layout.coords(r)` (what
`graph/dispatch.py` sends rows by: a tp group's ranks get the same rows).
`device_mesh()` is that layout as a 2-D torch DeviceMesh over the default group:
("dp", "tp"), or ("dp_sp", "tp") for a sequence-parallel role (dp and sp flattened: the
ranks its parameters replicate over, `RoleLayout.replica_dim`); `sequence_group()` this
rank's sp group (`placement.parallel.<role>.sp`).
State: `_MESHES`, (device type, dp, sp, tp, default group) -> the mesh, built once
per process (a mesh's sub-groups are created collectively, so roles of one pool with
the same layout share one; roles with another tp get their own mesh over the same world).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.core.layout import RoleLayout

__all__ = ["WorkerContext"]

_MESHES: dict[tuple, Any] = {}


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
    tp: int = 1                        # placement.parallel.<role>.tp
    sp: int = 1                        # placement.parallel.<role>.sp
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

    # ------------------------------------------------------------- layout
    @property
    def layout(self) -> RoleLayout:
        """The role's layout on its pool (ValueError where tp does not divide it)."""
        return RoleLayout(self.world_size, self.tp, self.sp)

    @property
    def dp(self) -> int:
        """Data-parallel groups of the role (ranks / tp)."""
        return self.layout.dp

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank(self.rank)

    def sequence_group(self):
        """This rank's sp group (the ranks that split its rows' positions), or None at
        sp=1. Every rank of the pool must call it: the groups are created collectively."""
        layout = self.layout
        if layout.sp <= 1:
            return None
        self.init_distributed()
        if not self.distributed:
            raise RuntimeError(f"sp={layout.sp} needs torch.distributed over "
                               f"{self.world_size} ranks (the local runtime cannot run it: "
                               "use runtime.name=ray)")
        key = ("sp", layout.sp, layout.tp, id(dist.group.WORLD))
        if key not in _MESHES:
            _MESHES[key] = {ranks: dist.new_group(list(ranks)) for ranks in layout.sp_groups}
        return next(group for ranks, group in _MESHES[key].items() if self.rank in ranks)

    def device_mesh(self):
        """The role's (dp, tp) DeviceMesh over the default process group (("dp_sp", "tp")
        at sp > 1), or None when the role is not tensor-parallel. Every rank of the pool
        must call it (the mesh's groups are created collectively), in the same order of
        roles."""
        if self.tp <= 1:
            return None
        layout = self.layout
        self.init_distributed()
        if not self.distributed:
            raise RuntimeError(f"tp={self.tp} needs torch.distributed over "
                               f"{self.world_size} ranks (the local runtime cannot run it: "
                               "use runtime.name=ray)")
        device = (self.device or ("cuda" if torch.cuda.is_available() else "cpu")).split(":")[0]
        key = (device, layout.dp, layout.sp, layout.tp, id(dist.group.WORLD))  # re-joined: anew
        if key not in _MESHES:
            from torch.distributed.device_mesh import init_device_mesh
            _MESHES[key] = init_device_mesh(device, layout.mesh_shape,
                                            mesh_dim_names=(layout.replica_dim, "tp"))
        return _MESHES[key]

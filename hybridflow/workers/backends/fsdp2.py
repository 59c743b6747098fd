"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer
state sharded over the ranks of a 1-D device mesh, on CUDA (nccl) or on the CPU (gloo).

Each decoder layer is one shard group, the root module another, so a layer's weights
are gathered only around its own forward and backward. `MixedPrecisionPolicy`:
parameters gathered in the compute dtype, gradients reduced in float32, the sharded
master weights and AdamW state stay float32. Checkpoints: a trained role saves its
shards with `parallel/sharded_checkpoint.py` (DCP: no gather, resumable onto another layout);
`optimizer_state` / `load_optimizer_state` serve the format from before it (this rank's
optimizer shard per rank, `Trainer.save` / `load`, same world size). State: the device
mesh, after `wrap`.

Tensor parallelism (`tensor_parallel = True`): given a role's (dp, tp) mesh, `wrap`
first shards the module over "tp" (`parallel/tensor_parallel.py`), then, when dp > 1, shards
it with FSDP over "dp" (a 2-D layout: dp-shard x tp; gradients are averaged over dp
only; at sp > 1 the outer dim is "dp_sp", dp and sp flattened, `core/layout.py`).
With dp = 1 the tensor-parallel module trains as it is (the tp-only path).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from hybridflow.core.dtensor import local_shard
from hybridflow.workers.backends.base import TrainingBackend

__all__ = ["FSDP2Backend", "decoder_layers"]


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: the classes a Hugging Face model names
    in `_no_split_modules` (e.g. LlamaDecoderLayer), found under LoRA wrappers too."""
    names: set[str] = set()
    for sub in module.modules():
        names |= set(getattr(sub, "_no_split_modules", None) or ())
    return [m for m in module.modules() if type(m).__name__ in names]


class FSDP2Backend(TrainingBackend):
    name = "fsdp2"
    shards = True
    tensor_parallel = True
    requires = ("torch.distributed.fsdp", "torch.distributed.tensor")

    def __init__(self, world: int, device: torch.device,
                 compute_dtype: torch.dtype = torch.float32, mesh=None):
        super().__init__(world, device, compute_dtype, mesh=mesh)
        self.mesh = None

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The role's parallelism in its order (`workers/parallel/parallelize.py`): tp over the
        role mesh's "tp" dim (a model built sharded is left as it is), then FSDP2."""
        from hybridflow.workers.parallel.parallelize import apply_parallelism
        tp_mesh = self.role_mesh["tp"] if self.role_mesh is not None else None
        return apply_parallelism(module, tp_mesh, dp_wrap=self._shard_over_dp)

    def _shard_over_dp(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            self.shards = False  # one data-parallel rank: nothing to shard over
            return module
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # a role mesh's outer dim: "dp", or "dp_sp" (dp and sp flattened) at sp > 1
        self.mesh = self.role_mesh[self.role_mesh.mesh_dim_names[0]] \
            if self.role_mesh is not None else init_device_mesh(self.device.type, (self.world,))
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype,
                                      reduce_dtype=torch.float32)
        for layer in decoder_layers(module):
            fully_shard(layer, mesh=self.mesh, mp_policy=policy)
        fully_shard(module, mesh=self.mesh, mp_policy=policy)
        return module

    def autocast(self):
        # the policy already casts the gathered parameters; autocast on top would
        # also run the float32 ops (norms, softmax) in low precision
        return nullcontext() if self.mesh is not None else super().autocast()

    def sync_context(self, model, last: bool):
        if self.mesh is not None:
            model.set_requires_gradient_sync(last)
        return nullcontext()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer state with each DTensor replaced by this rank's local shard."""
        state = optimizer.state_dict()
        state["state"] = {i: {k: local_shard(v)
                              for k, v in s.items()} for i, s in state["state"].items()}
        return state

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Wrap the saved local shards back as DTensors laid out like their parameters."""
        from torch.distributed.tensor import DTensor
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, entry in state["state"].items():
            param = params[int(index)]
            for key, value in entry.items():
                if isinstance(param, DTensor) and torch.is_tensor(value) and \
                        value.dim() == param.dim():
                    entry[key] = DTensor.from_local(value.to(param.device), param.device_mesh,
                                                    param.placements, run_check=False,
                                                    shape=param.shape, stride=param.stride())
        optimizer.load_state_dict(state)

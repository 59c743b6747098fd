"""A role's parallelism applied to a model, in one fixed order (as torchtitan's
`parallelize_<model>` does): tensor parallelism first (each layer's weights become
DTensor shards over the role mesh's "tp" dim, `parallel/tensor_parallel.parallelize`),
then sequence parallelism, which changes no weight (the parameters replicate over sp:
its hooks and the Ulysses attention are installed on the model at its first
sequence-parallel pass, `parallel/sequence_parallel.py`, and exchange each rank's
heads / tp heads over the sp group), then the training backend's data-parallel wrap
(FSDP2's `fully_shard` over the mesh's outer dim: "dp", or "dp_sp" at sp > 1, given as
`dp_wrap`). The order matters: FSDP2 shards the tensor-parallel shard, never the other
way round.

Every site that shards a model calls `apply_parallelism`: a model built whole and
sharded after (`models.py`), one built shard by shard on the meta device
(`shard_build.empty_shards`), and the backend's wrap (`backends/fsdp2.py`). A model
already tensor-parallel is left as it is (built shard by shard, then wrapped).
State: none.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["apply_parallelism"]


def apply_parallelism(model: torch.nn.Module, tp_mesh=None,
                      dp_wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                      ) -> torch.nn.Module:
    """`model` with the role's parallelism applied: tp over the 1-D mesh `tp_mesh`
    (None: tp=1), then `dp_wrap` (None: no wrap); sp touches no weight (see above)."""
    if tp_mesh is not None:
        from hybridflow.workers.parallel.tensor_parallel import parallelize
        parallelize(model, tp_mesh)  # in place; an already sharded model is left as is
    # sp: nothing to shard (parameters replicate over sp); sequence_parallel() hooks
    # the forwards at the first pass
    return dp_wrap(model) if dp_wrap is not None else model

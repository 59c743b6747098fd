"""Memory predicted before launch: each role's and each pool's peak on one device.

- `model_size.py`: exact parameter/buffer bytes from the real HF class on the meta
  device (LoRA adapters included);
- `passes.py`: the bytes of one pass (training state, activations, logits, KV cache),
  with the constants' derivation;
- `roles.py`: roles of a compiled plan, colocation, device capacity; engines
  and training strategies read through what they declare
  (`workers/rollout/engine_memory.py`, a backend class's `shards` / `gradient_buckets`);
- `engines.py`: what an engine that reserves its own memory (vLLM) holds per rank, and
  a CPU process's own bytes;
- `hosts.py`: one rank of each pool, and each host (every process on one machine);
- `report.py`: the table `hybridflow check --memory` prints.

Stateless: everything is computed from the config and the plan. Importing this
package imports torch; `hybridflow check` imports it only with `--memory`.

May import `core/`, `graph/`, `plan/`, `workers/` (the real model classes, sections and
declarations), `agents/` (an agent rollout's response width) and `planner/` (its device
table).
"""
from hybridflow.memory.model_size import Architecture, ModelSize, model_size, model_size_of
from hybridflow.memory.passes import MicroBatch, kv_cache_bytes, training_state
from hybridflow.memory.hosts import HostMemory, PoolMemory
from hybridflow.memory.roles import RoleMemory, actor_pass_memory, role_model_size

__all__ = ["Architecture", "ModelSize", "model_size", "model_size_of", "MicroBatch",
           "kv_cache_bytes", "training_state", "PoolMemory", "HostMemory", "RoleMemory",
           "actor_pass_memory", "role_model_size"]

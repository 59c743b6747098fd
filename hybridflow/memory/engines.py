"""What an engine that declares `reserves_device` (vLLM) holds on one rank, and what
every CPU process holds before any model.

An engine with a fixed KV cache (`EngineMemory.fixed_kv_cache`, and
`rollout.kv_cache_gib` > 0: vLLM's `kv_cache_memory_bytes`, which the engine sets on
every platform) allocates exactly that, not a share of the device:
- **engine weights**: its own copy of the policy (vLLM never shares the trainer's
  module), one tp rank's slice, in the model's dtype; a colocated engine built with
  dummy weights allocates them all the same;
- **kv cache**: `rollout.kv_cache_gib` per rank (vLLM's "per GPU" size; on the CPU
  per tp rank too);
- **engine runtime** (CPU only): what the engine's library, its workspace and its
  threads add to a process (`EngineMemory.host_bytes`), and the heap a weight load
  leaves behind (`host_weight_copies` x the weights: the load's transient copies are
  freed to the C allocator, which keeps them), both measured and declared by the
  engine (docs/rollout.md, "Memory on a CPU host"); on a GPU vLLM's activation
  buffers are not modeled.
With `rollout.kv_cache_gib=0` vLLM sizes the KV cache from
`rollout.gpu_memory_utilization` of the device, and the engine's reservation is that
share (on the CPU: of this machine's RAM, per rank).

The engine sleeps between generations (its bytes are a pass's, not resident) only
where vLLM's platform has sleep mode (a GPU: never on the CPU) and only colocated with
the actor (`rollout.enable_sleep_mode`; the engine itself decides the same way).

**Process** (`PROCESS_BYTES`, a CPU rank only): the Python interpreter, torch,
transformers and Ray's worker imported and run, before any model: measured 0.40-0.45
GiB RSS (Linux x86-64, torch 2.13, transformers 5.x); a GPU rank's device memory holds
none of it. Stateless.
"""
from __future__ import annotations

__all__ = ["engine_parts", "PROCESS_BYTES", "GIB"]

GIB = 1 << 30
PROCESS_BYTES = int(0.42 * GIB)


def engine_parts(s, engine, weight_bytes: int, capacity: float | None, cuda: bool,
                 notes: list[str]) -> dict[str, int]:
    """One rank's engine bytes (see the module docstring); `engine`: its
    `EngineMemory`; `weight_bytes`: one tp rank's slice of the model. Appends a note
    when a part cannot be counted."""
    rollout = s["rollout"]
    if engine.fixed_kv_cache and rollout.kv_cache_gib > 0:
        parts = {"engine weights": int(weight_bytes),
                 "kv cache": int(rollout.kv_cache_gib * GIB)}
        if not cuda:
            parts["engine runtime"] = int(engine.host_bytes
                                          + engine.host_weight_copies * weight_bytes)
        return parts
    if capacity is None:
        notes.append("the engine reserves rollout.gpu_memory_utilization of a device whose "
                     "size is unknown here: not counted")
        return {}
    where = "of the device" if cuda else "of this machine's RAM, per rank"
    notes.append(f"rollout.kv_cache_gib=0: the engine reserves rollout.gpu_memory_utilization="
                 f"{rollout.gpu_memory_utilization} {where}")
    return {"vllm reservation": int(rollout.gpu_memory_utilization * capacity)}


def engine_sleeps(s, cuda: bool, colocated: bool) -> bool:
    """Whether the engine frees its bytes between generations (sleep mode)."""
    return bool(s["rollout"].enable_sleep_mode) and cuda and colocated

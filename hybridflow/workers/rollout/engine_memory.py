"""What each rollout engine holds on a device, declared beside the engine registry so the
memory model (`memory/roles.py`) reads a declaration instead of switching on names.

`engine.py`'s registry records what an engine can do (`streams`, `tensor_parallel`);
this table records what it costs in memory:

- `reserves_device`: while it generates, the engine reserves
  `rollout.gpu_memory_utilization` of the device, its weights and KV cache inside it
  (vLLM; with `rollout.enable_sleep_mode` it frees it between generations), so it has no
  resident weights of its own to count;
- `fixed_kv_cache`: with `rollout.kv_cache_gib` > 0 the engine sizes its KV cache by it
  (vLLM's `kv_cache_memory_bytes`, set on every platform) and then holds its own
  weights, that KV cache and, on a CPU host, `host_bytes` of runtime (its library,
  workspace and threads in the process) plus `host_weight_copies` x its weights (the
  heap its weight loads leave with the C allocator), both measured: not a share of
  the device;
- `records_log_probs`: its generate keeps one more [rows, vocab] float tensor per
  decode step (the HF engine's log-prob recorder).

An engine that declares nothing (a registered engine of the user's) is counted like a
module-based engine: its own weights when apart from the actor, nothing reserved, no
recorder.

State: `_MEMORY`, engine name -> `EngineMemory`, filled when `hybridflow.workers.rollout`
is imported (hf, vllm) and by `declare_engine_memory`; read by `engine_memory`.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineMemory", "declare_engine_memory", "engine_memory", "declared_engines"]


@dataclass(frozen=True)
class EngineMemory:
    reserves_device: bool = False
    records_log_probs: bool = False
    fixed_kv_cache: bool = False
    host_bytes: int = 0
    host_weight_copies: float = 0.0


_MEMORY: dict[str, EngineMemory] = {}


def declare_engine_memory(name: str, memory: EngineMemory) -> None:
    """What the engine registered as `name` holds on a device (see the module's list)."""
    _MEMORY[name] = memory


def engine_memory(name: str) -> EngineMemory:
    """The declaration for `rollout.backend=<name>`; the default for an undeclared one."""
    return _MEMORY.get(name, EngineMemory())


def declared_engines() -> list[str]:
    return sorted(_MEMORY)

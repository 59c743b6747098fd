"""Rollout: engines that generate (`hf`, `vllm`, or one you register), the weights
that move from the actor to them, and the `rollout` role (`RolloutWorker`).

See docs/rollout.md. A new engine is one module with a factory and one call:

    from hybridflow.workers.rollout import register_engine
    register_engine("mine", lambda spec: MyEngine(spec))   # rollout.backend=mine
"""
from hybridflow.workers.rollout.engine import (EngineSpec, RolloutEngine, engine_names,
                                               make_engine, register_engine)
from hybridflow.workers.rollout.engine_memory import EngineMemory, declare_engine_memory
from hybridflow.workers.rollout.generation import (GENERATE_WRITES, assemble_rollout,
                                                   generate_rows, logprob_mismatch,
                                                   sampling_options)
from hybridflow.workers.rollout.hf import make_hf_engine
from hybridflow.workers.rollout.vllm import make_vllm_engine

__all__ = ["EngineSpec", "RolloutEngine", "register_engine", "make_engine", "engine_names",
           "GENERATE_WRITES", "assemble_rollout", "generate_rows", "logprob_mismatch",
           "sampling_options", "EngineMemory", "declare_engine_memory"]

register_engine("hf", make_hf_engine, replace=True, streams=True, tensor_parallel=True)
register_engine("vllm", make_vllm_engine, replace=True, streams=True,
                tensor_parallel=make_vllm_engine.tensor_parallel)
# what building each imports, for `hybridflow check` (program/preflight.py), as a
# registered factory declares it
make_hf_engine.requires = ("transformers",)
make_vllm_engine.requires = ("vllm",)
# the hf engine's ranks decode in lockstep over a sharded model (tp, or FSDP's
# synced_gpus): it cannot stream there (program/parallel_checks.py refuses it)
make_hf_engine.streams_sharded = False
# what each holds on a device, for the memory model (engine_memory.py)
declare_engine_memory("hf", EngineMemory(records_log_probs=True))
# vLLM's CPU engine in a process: its library, workspace and threads beside the model and
# the KV cache (measured: docs/rollout.md, "Memory on a CPU host")
declare_engine_memory("vllm", EngineMemory(reserves_device=True, fixed_kv_cache=True,
                                           host_bytes=int(0.3 * (1 << 30)),
                                           host_weight_copies=1.0))

"""Each model phase's achieved FLOP rate against the device's peak: `perf/mfu`, which
the scheduler reports per node as `perf/mfu/<node>` (verl's name; core/metric_names.py).

Model FLOPs, as the field counts them (no recomputation, no attention term):
- a forward (log-probs, values): 2 N per token;
- a training pass (forward + backward): 6 N per token, times the epochs;
- generation: 2 N per token of every sequence's prompt (prefill, once per sample)
  plus 2 N per generated token,
with N the parameters of the model's matmuls (its `nn.Linear` layers, the output head
included, the input embedding's lookup not: it does no multiply) and the tokens the
real ones (`attention_mask`), never the padding. The seconds are the phase's own on
this rank; the peak is this process's measured matmul rate in the phase's compute
dtype (core/device_peak.py: measured once, cached), so on a CPU the ratio is against
what this machine reaches, not a datasheet. A rank with no rows reports nothing.

An engine that holds no torch module of ours (vLLM: its own layers, not `nn.Linear`)
says its count itself, as `matmul_params` (`engine_matmul_params`).

State: `_PARAMS`, the matmul parameter count per module (weakly keyed), filled on
first use.
"""
from __future__ import annotations

import time
import weakref

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.device_peak import device_peak
from hybridflow.core.dtensor import local_shard
from hybridflow.core.metric_names import MFU

__all__ = ["matmul_params", "engine_matmul_params", "real_tokens", "phase_mfu", "params_mfu",
           "FORWARD", "TRAIN", "MFU"]

FORWARD, TRAIN = 2, 6  # model FLOPs per parameter per token
_PARAMS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()


def matmul_params(module) -> int:
    """Weights of the module's `nn.Linear` layers (each does 2 x its weights FLOPs per
    token); LoRA adapters and a tied head are linear layers too. Local shards under
    tensor parallelism: the FLOPs this rank does."""
    if module is None:
        return 0
    if module not in _PARAMS:
        total = 0
        for layer in module.modules():
            if isinstance(layer, torch.nn.Linear):
                weight = layer.weight
                total += local_shard(weight).numel()
        _PARAMS[module] = total
    return _PARAMS[module]


def engine_matmul_params(engine) -> int:
    """A rollout engine's matmul weights on this rank: its module's where it generates
    with one (the HF engine), else the count it keeps (vLLM's `matmul_params`), else 0."""
    module = getattr(engine, "module", None)
    if module is not None:
        return matmul_params(module)
    return int(getattr(engine, "matmul_params", 0) or 0)


def real_tokens(batch: Batch, key: str = "attention_mask") -> int:
    """Tokens the model attends to in `batch` (padding excluded); 0 without the key."""
    return int(batch[key].sum()) if len(batch) and key in batch else 0


def phase_mfu(module, device, dtype, flops_per_param_token: float, tokens: int,
              began: float) -> dict[str, float]:
    """{MFU: achieved / peak} of a phase that began at `began` (time.perf_counter) and
    ran `tokens` tokens through `module`; {} when it did no work."""
    return params_mfu(matmul_params(module), device, dtype, flops_per_param_token, tokens,
                      began)


def params_mfu(params: int, device, dtype, flops_per_param_token: float, tokens: int,
               began: float) -> dict[str, float]:
    """`phase_mfu` for a model of `params` matmul weights (an engine's own count)."""
    seconds = time.perf_counter() - began
    flops = flops_per_param_token * params * tokens
    if flops <= 0 or seconds <= 0:
        return {}
    return {MFU: flops / seconds / device_peak(device, dtype)}

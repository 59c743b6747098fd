"""Weight files: the full (unsharded) state dict of a module, and `model.safetensors`
beside the Hugging Face config, the layout `from_pretrained` loads.

Stateless. Under FSDP2 the gather (`full_state_dict`) and the load are collectives:
every rank calls them, and the gather holds the whole model: trained roles checkpoint
with `parallel/sharded_checkpoint.py` and sync and export with `parallel/gather.py`
(bucket by bucket) instead. Used by untrained roles' checkpoints, checkpoints from
before sharding, and LoRA merging; it imports no other worker module.
"""
from __future__ import annotations

import os

import torch

from hybridflow.core import dtensor

__all__ = ["WEIGHTS_FILE", "full_state_dict", "load_full_state_dict", "save_weights",
           "load_weights", "is_sharded"]

WEIGHTS_FILE = "model.safetensors"


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether the module's parameters are DTensor shards (FSDP2)."""
    return any(dtensor.is_sharded(p) for p in module.parameters())


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight, unsharded, on CPU (collective under FSDP2: call on all ranks)."""
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def save_weights(module: torch.nn.Module, directory: str, weights: dict | None = None) -> None:
    """`model.safetensors` (tied tensors once) and the HF config beside it."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    weights = full_state_dict(module) if weights is None else weights
    seen, unique = set(), {}
    for name, t in weights.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            unique[name] = t.contiguous()
    save_file(unique, os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)


def load_weights(module: torch.nn.Module, directory: str) -> None:
    """Load `model.safetensors` from `directory` into `module` (sharded or not)."""
    from hybridflow.core.loading import read_safetensors
    path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in checkpoint directory {directory!r}")
    weights = read_safetensors(path, "checkpoint weights")  # a damaged file named as one
    try:
        load_full_state_dict(module, weights)
    except ValueError as err:
        raise ValueError(f"checkpoint {directory!r} does not match the model: {err}") from None


def load_full_state_dict(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy full weights into `module`, sharding them under FSDP2 (collective); tied
    weights may appear once. ValueError naming missing or unexpected keys."""
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(module, weights, options=StateDictOptions(full_state_dict=True))
        return
    missing, unexpected = module.load_state_dict(weights, strict=False)
    state = module.state_dict(keep_vars=True)
    loaded = {id(t) for n, t in state.items() if n in weights}
    truly_missing = [n for n in missing if id(state[n]) not in loaded]
    if unexpected or truly_missing:
        raise ValueError(f"missing {truly_missing[:5]}, unexpected {list(unexpected)[:5]}")

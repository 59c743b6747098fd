"""LoRA adapters on the actor (peft): wrap, switch off, save, load, merge.

With `actor.lora.rank > 0` the actor is the frozen base model plus low-rank
adapters (B·A on `target_modules`); only the adapters train. The base policy is
then the actor with its adapters switched off (`adapters_disabled`), which is how
a colocated reference serves its log-probs without a second copy of the base.

Checkpoints hold only the adapters, in peft's layout (`adapter_model.safetensors`
and `adapter_config.json`, loadable by `PeftModel.from_pretrained`); the base is
what `model.path` (or the seeded `model.hf_config` build) gives. `merge_into_base`
folds them into plain Hugging Face weights for export and for rollout engines that
hold their own copy (vLLM).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

__all__ = [
    "ADAPTER_FILE",
    "adapter_state_dict",
    "adapters_disabled",
    "apply_lora",
    "is_lora",
    "load_adapter",
    "merge_checkpoint",
    "merge_into_base",
    "merged_state_dict",
    "save_adapter",
]

ADAPTER_FILE = "adapter_model.safetensors"


def apply_lora(module: torch.nn.Module, lora, seed: int = 0) -> torch.nn.Module:
    """Wrap `module` with LoRA adapters (peft) when `lora.rank > 0`; base weights freeze.
    The adapters' random init is seeded, so every data-parallel rank starts from the
    same adapters (FSDP2 shards each rank's own copy; nothing is broadcast)."""
    if lora.rank <= 0:
        return module
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError as err:
        raise ImportError("actor.lora.rank > 0 needs peft: pip install 'hybridflow[lora]'") \
            from err
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(module, PeftLoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))


def is_lora(module) -> bool:
    return module is not None and hasattr(module, "peft_config") and \
        hasattr(module, "disable_adapter")


@contextmanager
def adapters_disabled(module):
    """The base policy: `module` with its adapters off and in eval mode (no dropout)."""
    was_training = module.training
    module.eval()
    try:
        with module.disable_adapter():
            yield module
    finally:
        module.train(was_training)


def adapter_state_dict(module, weights: dict | None = None) -> dict[str, torch.Tensor]:
    """The adapter tensors only, on CPU, named as peft saves them. `weights` may be
    the module's full (unsharded) state dict, e.g. gathered under FSDP2."""
    from peft import get_peft_model_state_dict
    state = get_peft_model_state_dict(module, state_dict=weights)
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def save_adapter(module, directory: str, weights: dict | None = None) -> None:
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    save_file(adapter_state_dict(module, weights), os.path.join(directory, ADAPTER_FILE),
              metadata={"format": "pt"})
    module.peft_config["default"].save_pretrained(directory)


def load_adapter(module, directory: str) -> None:
    from peft import set_peft_model_state_dict
    from hybridflow.core.loading import read_safetensors
    path = os.path.join(directory, ADAPTER_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {ADAPTER_FILE} in checkpoint directory {directory!r}: "
                                "was it saved by a run with actor.lora.rank > 0?")
    result = set_peft_model_state_dict(module, read_safetensors(path, "checkpoint adapter"))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter {directory!r} does not match the model (rank or "
                         f"target_modules differ?): unexpected {list(unexpected)[:5]}")


@torch.no_grad()
def merged_state_dict(module, weights: dict | None = None) -> dict[str, torch.Tensor]:
    """Plain HF weight names -> base weight + scaled B·A, without touching `module`.
    `weights` may be the module's full (unsharded) state dict, e.g. gathered under
    FSDP2; by default the module's own."""
    from peft.tuners.lora import LoraLayer
    weights = module.state_dict() if weights is None else weights
    merged: dict[str, torch.Tensor] = {}
    for name, layer in module.named_modules():
        if isinstance(layer, LoraLayer) and "default" in layer.lora_A:
            base = weights[f"{name}.base_layer.weight"]
            delta = weights[f"{name}.lora_B.default.weight"].to(torch.float32) @ \
                weights[f"{name}.lora_A.default.weight"].to(torch.float32)
            if getattr(layer, "fan_in_fan_out", False):
                delta = delta.T
            merged[f"{name}.base_layer.weight"] = \
                (base.float() + delta * layer.scaling["default"]).to(base.dtype)
    out = {}
    for name, tensor in weights.items():
        if "lora_" in name:
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out[plain] = merged.get(name, tensor)
    return out


def merge_into_base(base: torch.nn.Module, adapter_dir: str) -> torch.nn.Module:
    """`base` with the adapter saved in `adapter_dir` merged in: a plain HF model. Its
    safetensors file is checked first: peft would otherwise fall back to a `.bin`
    (a pickle) beside it."""
    from peft import PeftModel
    from hybridflow.core.loading import check_safetensors
    check_safetensors(os.path.join(adapter_dir, ADAPTER_FILE), "checkpoint adapter")
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


def merge_checkpoint(adapter_dir: str, cfg, seed: int, out: str) -> None:
    """Write `out`: a plain HF model directory of the run's base model (`cfg.model`,
    built as the actor built it, with `seed`) with the adapter in `adapter_dir` merged."""
    from hybridflow.workers.config import ModelConfig, read_section
    from hybridflow.workers.models import build_causal_lm
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    from hybridflow.workers.weights import save_weights
    model_cfg = read_section(cfg, "model", ModelConfig)
    tokenizer = load_tokenizer(tokenizer_spec(model_cfg))
    base = build_causal_lm(model_cfg, tokenizer, torch.device("cpu"), seed)
    save_weights(merge_into_base(base, adapter_dir), out)
    tokenizer.save_pretrained(out)

"""What vLLM refuses, checked before launch with the model's name in the message.

- Head sizes: vLLM's attention backend supports only some (the CPU backend: 32, 64,
  80, 96, 112, 128, 160, 192, 224, 256, 512); another fails at the first generate
  with a raw kernel error. The list is read from vLLM's backend where vLLM is
  importable (the CPU platform's `CPUAttentionBackend`); a CUDA platform picks its
  backend at start-up from many, so no list is known before launch there.
- tensor-parallel sizes: each rank of a tp group holds whole attention heads and whole
  key/value heads, so tp divides both (vLLM itself would replicate KV heads when tp
  exceeds them; the training side cannot, and the two layouts share one check).
- dtype names: vLLM takes `float32`/`bfloat16`/`float16`, not the `fp32`/`bf16`
  spellings the model section also accepts.

`check_vllm_model(model_cfg, where)` is called by preflight (when vLLM imports in the
driver) and again by the engine before it builds vLLM (in the worker).
"""
from __future__ import annotations

import json
import os

__all__ = ["vllm_dtype", "head_size", "supported_head_sizes", "check_vllm_model",
           "check_vllm_tp", "preflight_vllm"]


def vllm_dtype(name: str) -> str:
    """The model section's dtype name as vLLM spells it (`bf16` -> `bfloat16`)."""
    from hybridflow.workers.models import resolve_dtype
    return str(resolve_dtype(name)).removeprefix("torch.")


def _model_values(model_cfg) -> tuple[dict, str]:
    if model_cfg.path is not None:
        with open(os.path.join(model_cfg.path, "config.json")) as fh:
            return json.load(fh), f"model.path {model_cfg.path!r}"
    return dict(model_cfg.hf_config), "model.hf_config"


def head_size(values: dict) -> int:
    """A causal LM config's attention head size (`head_dim`, else hidden / heads)."""
    from hybridflow.core.model_config import standard_shapes
    text = standard_shapes(values)
    if text.get("head_dim"):
        return int(text["head_dim"])
    hidden = int(text.get("hidden_size", 4096))
    return hidden // int(text.get("num_attention_heads", 32))


def supported_head_sizes() -> list[int] | None:
    """The head sizes this platform's vLLM attention accepts; None when vLLM is not
    importable here or the platform chooses among backends only at start-up."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        return list(CPUAttentionBackend.get_supported_head_sizes())
    return None


def check_vllm_model(model_cfg, where: str = "rollout.backend='vllm'") -> None:
    """ValueError naming the model and the sizes allowed when vLLM cannot run it."""
    vllm_dtype(model_cfg.dtype)  # ValueError naming the dtypes for an unknown name
    allowed = supported_head_sizes()
    if allowed is None:
        return
    values, name = _model_values(model_cfg)
    size = head_size(values)
    if size not in allowed:
        raise ValueError(
            f"{where}: {name} has attention head size {size} (head_dim, or hidden_size / "
            f"num_attention_heads), which vLLM's attention on this platform does not "
            f"support (allowed: {', '.join(map(str, allowed))}); use rollout.backend='hf' "
            "for this model or one whose head size is in the list (e.g. set head_dim)")


def head_counts(values: dict) -> tuple[int, int]:
    """(attention heads, key/value heads) of a causal LM config."""
    from hybridflow.core.model_config import standard_shapes
    text = standard_shapes(values)
    heads = int(text.get("num_attention_heads", 32))
    return heads, int(text.get("num_key_value_heads") or heads)


def check_vllm_tp(model_cfg, tp: int, key: str = "placement.parallel.rollout.tp") -> None:
    """ValueError naming the key, the model and the sizes allowed when `tp` does not
    divide the model's attention heads or key/value heads."""
    if tp <= 1:
        return
    values, name = _model_values(model_cfg)
    heads, kv = head_counts(values)
    if heads % tp or kv % tp:
        valid = [d for d in range(1, heads + 1) if heads % d == 0 and kv % d == 0]
        raise ValueError(
            f"{key}={tp}: {name} has {heads} attention heads and {kv} key/value heads; a "
            f"vLLM tp group holds whole heads on each rank, so tp divides both (allowed: "
            f"{', '.join(map(str, valid))})")


def preflight_vllm(cfg) -> None:
    """Preflight: a run with rollout.backend='vllm' whose model vLLM cannot run fails
    before any worker starts (where vLLM imports in the driver; the engine checks
    again in the worker otherwise). Raises the run's ConfigError."""
    from hybridflow.core.constraints import ConfigError
    from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
    if read_section(cfg, "rollout", RolloutConfig).backend != "vllm":
        return
    try:
        check_vllm_model(read_section(cfg, "model", ModelConfig))
    except ValueError as err:
        raise ConfigError(str(err)) from None

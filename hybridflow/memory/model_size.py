"""Exact parameter and buffer sizes of a role's model, from the real model class
built on the meta device (no weights are allocated, nothing is downloaded).

`model_size(hf_config, head, dtype, lora)` builds the Hugging Face class the worker
builds (`AutoModelForCausalLM`, `...ForTokenClassification` for a value model,
`...ForSequenceClassification` for a reward model) under accelerate's
`init_empty_weights`, casts it to the run's dtype as the worker does, wraps it in
the same peft adapters when LoRA is on, and counts. So tied embeddings (one
tensor), MoE experts, GQA layouts and peft's float32 adapters on a bf16 base are
counted as they will be allocated. Stateless; results are cached per arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch

__all__ = ["ModelSize", "model_size", "model_size_of", "Architecture"]

_HEADS = {"causal": "AutoModelForCausalLM", "value": "AutoModelForTokenClassification",
          "reward": "AutoModelForSequenceClassification"}


@dataclass(frozen=True)
class Architecture:
    """The shapes that size activations and the KV cache (from the HF config)."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


@dataclass(frozen=True)
class ModelSize:
    """Counts of one model as the worker holds it (unique tensors: tied weights once)."""
    params: int              # parameter elements
    trainable: int           # elements with requires_grad (the adapters only under LoRA)
    param_bytes: int
    trainable_bytes: int     # bytes of the trainable parameters, in their own dtypes
    trainable_tensors: int   # how many trainable tensors (AdamW keeps a step per tensor)
    buffer_bytes: int        # rotary tables and other buffers
    largest_trainable_bytes: int  # the biggest trainable tensor (optimizer temporaries)
    dtype_bytes: int         # bytes per element of the model's (compute) dtype
    arch: Architecture

    @property
    def weight_bytes(self) -> int:
        return self.param_bytes + self.buffer_bytes


def architecture(config) -> Architecture:
    """The attention and MLP shapes of an HF config (text config of a multimodal one)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    inter = getattr(text, "intermediate_size", None) or getattr(text, "ffn_dim", None) \
        or 4 * hidden
    return Architecture(hidden=hidden, intermediate=int(inter),
                        layers=int(text.num_hidden_layers), heads=heads,
                        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                        head_dim=head_dim, vocab=int(text.vocab_size))


def model_size_of(module: torch.nn.Module, arch: Architecture, dtype: torch.dtype) -> ModelSize:
    """Count a built module (meta or real): what `model_size` returns for it."""
    params = list(module.parameters())  # unique: tied weights appear once
    trainable = [p for p in params if p.requires_grad]

    def nbytes(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)
    return ModelSize(
        params=sum(p.numel() for p in params), trainable=sum(p.numel() for p in trainable),
        param_bytes=nbytes(params), trainable_bytes=nbytes(trainable),
        trainable_tensors=len(trainable), buffer_bytes=nbytes(module.buffers()),
        largest_trainable_bytes=max((nbytes([p]) for p in trainable), default=0),
        dtype_bytes=torch.empty(0, dtype=dtype).element_size(), arch=arch)


def _lora_key(lora) -> tuple | None:
    if lora is None or int(getattr(lora, "rank", 0)) <= 0:
        return None
    return (int(lora.rank), int(lora.alpha), float(lora.dropout), tuple(lora.target_modules))


def model_size(config, head: str = "causal", dtype: torch.dtype = torch.float32,
               lora=None, trained: bool = False) -> ModelSize:
    """Sizes of the model `config` (a transformers `PretrainedConfig`) as a worker
    builds it: `head` is "causal", "value" (one label per token) or "reward" (one per
    sequence); `lora` a config with `rank`, `alpha`, `dropout`, `target_modules`;
    `trained`: the trainer gives a bf16/fp16 model float32 master weights (its
    trainable parameters are upcast in place, `training.master_weights`)."""
    if head not in _HEADS:
        raise ValueError(f"unknown model head {head!r}; use one of {sorted(_HEADS)}")
    return _model_size(config.to_json_string(use_diff=False), type(config), head, dtype,
                       _lora_key(lora), trained)


@lru_cache(maxsize=64)
def _model_size(config_json: str, config_cls, head: str, dtype: torch.dtype,
                lora: tuple | None, trained: bool) -> ModelSize:
    import json

    import transformers
    from accelerate import init_empty_weights
    config = config_cls.from_dict(json.loads(config_json))
    if head != "causal":
        config.num_labels = 1
    with init_empty_weights(include_buffers=True):
        module = getattr(transformers, _HEADS[head]).from_config(config)
    module = module.to(dtype)
    if lora is not None:
        from peft import LoraConfig, get_peft_model
        rank, alpha, dropout, targets = lora
        module = get_peft_model(module, LoraConfig(r=rank, lora_alpha=alpha,
                                                   lora_dropout=dropout,
                                                   target_modules=list(targets),
                                                   task_type="CAUSAL_LM"))
    if trained:
        from hybridflow.workers.training import master_weights
        master_weights(module)  # the very function the trainer runs, here on meta
    return model_size_of(module, architecture(config), dtype)


def tensor_parallel_slice(size: ModelSize, tp: int) -> ModelSize:
    """What one rank of a tensor-parallel group of `tp` holds and computes with: the
    projections are split by heads and by the MLP's intermediate width, embedding and
    head by vocabulary (the tied pair once), so weights, gradients and moments are
    1/tp; hidden-sized activations (the residual stream, the norms) stay whole on
    every rank. The norms' few weights counted as split too: negligible."""
    if tp <= 1:
        return size
    arch = replace(size.arch, intermediate=-(-size.arch.intermediate // tp),
                   heads=max(1, size.arch.heads // tp),
                   kv_heads=max(1, size.arch.kv_heads // tp),
                   vocab=-(-size.arch.vocab // tp))
    return replace(size, params=-(-size.params // tp), trainable=-(-size.trainable // tp),
                   param_bytes=-(-size.param_bytes // tp),
                   trainable_bytes=-(-size.trainable_bytes // tp),
                   largest_trainable_bytes=-(-size.largest_trainable_bytes // tp), arch=arch)


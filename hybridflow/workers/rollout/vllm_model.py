"""The directories vLLM opens for an engine: the model (`model.path`, or a config
written from `model.hf_config`), the tokenizer with a generation config made from the
project's tokenizer (vLLM stops at the config's eos as well as the tokenizer's), and the
context length. Stateless: each call writes a fresh temporary directory.
"""
from __future__ import annotations

import tempfile

__all__ = ["causal_lm_architecture", "tokenizer_directory", "model_directory",
           "max_model_len"]


def causal_lm_architecture(model_type: str) -> str:
    """The Hugging Face causal-LM class name for a model type (`LlamaForCausalLM`)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"model.hf_config model_type {model_type!r} has no causal-LM class "
                         "in transformers, so vLLM cannot build it")
    return name


def tokenizer_directory(tokenizer, model_path: str) -> str:
    """The project's tokenizer and a generation config made from it, for vLLM (which
    would otherwise stop at whatever eos the model directory's configs name), beside
    the model's config with the tokenizer's ids (vLLM reads a config there too)."""
    from transformers import AutoConfig, GenerationConfig

    from hybridflow.workers.models import token_ids_from_tokenizer
    path = tempfile.mkdtemp(prefix="hybridflow_vllm_tok_")
    config = AutoConfig.from_pretrained(model_path)
    token_ids_from_tokenizer(config, tokenizer)
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(path)
    return path


def model_directory(model_cfg, tokenizer) -> str:
    """A directory vLLM can open: `model.path`, or the config (with `architectures`
    and the tokenizer's ids) of a model built from `model.hf_config`, in a temp dir."""
    if model_cfg.path is not None:
        return model_cfg.path
    from transformers import AutoConfig

    from hybridflow.workers.models import token_ids_from_tokenizer
    values = dict(model_cfg.hf_config)
    model_type = values.pop("model_type", "llama")
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **values)
    token_ids_from_tokenizer(config, tokenizer)
    config.architectures = [causal_lm_architecture(model_type)]
    path = tempfile.mkdtemp(prefix="hybridflow_vllm_")
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def max_model_len(model_cfg, rollout_cfg) -> int:
    if rollout_cfg.max_model_len > 0:
        return rollout_cfg.max_model_len
    if model_cfg.path is None:
        return int(model_cfg.hf_config.get("max_position_embeddings", 2048))
    from transformers import AutoConfig
    return int(getattr(AutoConfig.from_pretrained(model_cfg.path), "max_position_embeddings",
                       2048))

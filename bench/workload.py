"""A realistic CPU workload for the benchmarks: a Qwen2-architecture model built from
a config (random weights, no download) and rollouts whose lengths vary as sampled
responses do.

- `make_model(size)`: a Qwen2ForCausalLM of ~5M ("5m"), ~10M ("10m", the default)
  or ~28M ("28m") parameters, tied embeddings as the small Qwen2 models have, seeded.
  `hf_config(size)` is the same model as a `model.hf_config` dict for the engine.
- `response_lengths(rows)`: a long tail. Lengths are log-normal (median 96 tokens,
  sigma 0.5) clipped to [16, max_response]; the rows that reach `max_response` are
  the ones that ran into `max_new_tokens` without an EOS, as in real sampling. With
  the defaults about 3 % of the rows hit the cap of 256 and the padding of a
  `[rows, 256]` response block is ~57 % (mean length ~110).
- `make_rollout(prompts, n)`: the generate output the actor writes (left-padded
  prompts of 24-64 tokens, right-padded responses ending in EOS, masks, position
  ids) plus `old_log_probs`, `ref_log_prob`, `advantages`, `values`, `returns` and
  `uid`: everything the log-prob, value and update passes read.
- `LengthSampler`: a logits processor that makes HF `generate` stop each row at a
  length drawn from `response_lengths`, so generation with random weights takes
  realistic lengths too.

Everything is seeded: a bench gets the same model and the same lengths every run.
"""
from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["SIZES", "VOCAB", "PAD_ID", "EOS_ID", "QWEN2_05B", "hf_config", "engine_overrides",
           "make_model", "response_lengths", "make_prompts", "make_rollout", "LengthSampler",
           "left_pad"]

VOCAB = 16384
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2

_QWEN2 = {"model_type": "qwen2", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "max_position_embeddings": 1024, "tie_word_embeddings": True,
          "vocab_size": VOCAB, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
          "bos_token_id": BOS_ID}

# Qwen2.5-0.5B's shapes (494M parameters with tied embeddings): bench/gpu.py's model,
# and its --tp children's (bench/gpu_tp.py)
QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
             "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID}

# name -> (hidden, layers, heads, kv heads, intermediate); head_dim = hidden / heads
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "5m": (192, 6, 6, 2, 512),
    "10m": (256, 8, 8, 2, 768),
    "28m": (384, 12, 6, 2, 1280),
}


def hf_config(size: str = "10m", **overrides) -> dict[str, Any]:
    """The model as a `model.hf_config` dict (what `AutoConfig.for_model` takes)."""
    if size not in SIZES:
        raise ValueError(f"unknown workload size {size!r}; use one of {sorted(SIZES)}")
    hidden, layers, heads, kv_heads, inter = SIZES[size]
    return {**_QWEN2, "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": inter, **overrides}


def engine_overrides(size: str = "10m", prompts: int = 32, n: int = 4,
                     max_response: int = 256, max_prompt: int = 64) -> list[str]:
    """`key=value` overrides that put a shipped graph on this workload's model and
    shapes (e.g. `hybridflow check graphs/grpo.py --memory <these>`). The prompts
    still come from the graph's dataset and tokenizer."""
    values = hf_config(size)
    model = ["model.path=null", "model.tokenizer=char"] + [
        f"model.hf_config.{key}={value}" for key, value in values.items()
        if key not in ("pad_token_id", "eos_token_id", "bos_token_id")]
    return model + [f"data.batch_size={prompts}", f"rollout.n={n}",
                    f"rollout.max_new_tokens={max_response}",
                    f"data.max_prompt_length={max_prompt}"]


def make_model(size: str = "10m", dtype: torch.dtype = torch.float32, seed: int = 0,
               device: str | torch.device = "cpu", **overrides):
    """A seeded Qwen2ForCausalLM built from `hf_config(size)` (random weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    values = hf_config(size, **overrides)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype=dtype, device=device)


def response_lengths(rows: int, max_response: int = 256, median: float = 96.0,
                     sigma: float = 0.5, min_response: int = 16,
                     seed: int = 0) -> torch.Tensor:
    """[rows] int64 response lengths (EOS included), log-normal with a long tail,
    clipped to [min_response, max_response]."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + sigma * torch.randn(rows, generator=gen))
    return raw.round().long().clamp(min_response, max_response)


def make_prompts(prompts: int = 32, min_prompt: int = 24, max_prompt: int = 64,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompt ids and mask, [prompts, max_prompt], lengths uniform in
    [min_prompt, max_prompt] (min_prompt capped at max_prompt)."""
    min_prompt = min(min_prompt, max_prompt)
    gen = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(min_prompt, max_prompt + 1, (prompts,), generator=gen)
    ids = torch.randint(3, VOCAB, (prompts, max_prompt), generator=gen)
    mask = (torch.arange(max_prompt) >= max_prompt - lengths[:, None]).long()
    return {"input_ids": torch.where(mask.bool(), ids, PAD_ID), "attention_mask": mask}


def make_rollout(prompts: int = 32, n: int = 4, max_response: int = 256,
                 max_prompt: int = 64, seed: int = 0):
    """A `Batch` shaped exactly like the actor's generate output for `prompts` x `n`
    rows, with the columns the later passes read (random values, right shapes)."""
    from hybridflow.core.batch import Batch
    from hybridflow.workers.rollout import assemble_rollout
    rows = prompts * n
    prompt = make_prompts(prompts, max_prompt=max_prompt, seed=seed)
    repeated = Batch({k: v.repeat_interleave(n, dim=0) for k, v in prompt.items()})
    lengths = response_lengths(rows, max_response, seed=seed)
    gen = torch.Generator().manual_seed(seed + 2)
    responses = torch.randint(3, VOCAB, (rows, max_response), generator=gen)
    at = torch.arange(max_response)
    capped = lengths >= max_response  # ran into max_new_tokens: no EOS
    eos_here = (at[None, :] == lengths[:, None] - 1) & ~capped[:, None]
    responses = torch.where(eos_here, EOS_ID, responses)
    batch = assemble_rollout(repeated, responses, PAD_ID, EOS_ID)
    mask = batch["response_mask"].float()
    return batch.update(Batch({
        "old_log_probs": -torch.rand(rows, max_response, generator=gen) * 5 * mask,
        "ref_log_prob": -torch.rand(rows, max_response, generator=gen) * 5 * mask,
        "advantages": torch.randn(rows, max_response, generator=gen) * mask,
        "values": torch.randn(rows, max_response, generator=gen) * mask,
        "returns": torch.randn(rows, max_response, generator=gen) * mask,
    }, {"uid": [str(i // n) for i in range(rows)]}))


class LengthSampler:
    """A `generate` logits processor forcing EOS when a row reaches its drawn length
    (and never before), so random weights still give realistic lengths. Rows are
    drawn once per call; build a fresh one (or a new seed) per generate call."""

    def __init__(self, rows: int, max_response: int = 256, seed: int = 0,
                 prompt_width: int = 0):
        self.lengths = response_lengths(rows, max_response, seed=seed)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_width  # tokens generated so far
        done = (self.lengths[: scores.shape[0]].to(scores.device) - 1) <= step
        scores = scores.clone()
        scores[:, EOS_ID] = float("-inf")
        scores[done] = float("-inf")
        scores[done, EOS_ID] = 0.0
        return scores


def left_pad(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists as a left-padded [B, longest] batch and its attention mask."""
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return input_ids, mask

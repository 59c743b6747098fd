"""One `generate` call, the same for every engine and for both roles that generate
(`actor.generate` and `rollout.generate`): sampling options, the output columns,
`policy_version` per row and `token_versions` per token (core/columns.py), and the
rollout metrics.

Output layout: prompts stay left-padded as given; responses are right-padded with
the pad token to exactly `max_new_tokens`, so shards from every rank concatenate.
`rollout_log_probs` [B, R] float32 is the log-prob of each sampled token under the
distribution the engine sampled from (0 on padding), for off-policy corrections and
the engine-vs-trainer mismatch metric (`logprob_mismatch`).
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import (POLICY_VERSION, ROLLOUT_LOG_PROBS, TOKEN_VERSIONS,
                                     uniform_token_versions)
from hybridflow.core.metric_names import SAMPLED_VERSION
from hybridflow.workers.config import RolloutConfig
from hybridflow.workers.sequences import position_ids_from_mask, response_mask_from_ids

__all__ = ["GENERATE_WRITES", "ENGINE_COLUMNS", "sampling_options", "assemble_rollout",
           "generate_rows", "logprob_mismatch"]

ENGINE_COLUMNS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                  "position_ids", "response_length", ROLLOUT_LOG_PROBS)
GENERATE_WRITES = ENGINE_COLUMNS + (POLICY_VERSION, TOKEN_VERSIONS)


def sampling_options(cfg: RolloutConfig, **overrides) -> RolloutConfig:
    """The rollout config with per-call overrides (None means keep the config's)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(RolloutConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown generate option(s) {sorted(unknown)}")
    opts = replace(cfg, **given)
    if opts.n < 1:
        raise ValueError(f"generate needs n >= 1, got n={opts.n}")
    if opts.max_new_tokens < 1:
        raise ValueError(f"generate needs max_new_tokens >= 1, got {opts.max_new_tokens}")
    if opts.do_sample and opts.temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {opts.temperature}; "
                         "use do_sample=False for greedy decoding")
    return opts


def assemble_rollout(prompts: Batch, responses: torch.Tensor, pad_id: int, eos_id,
                     log_probs: torch.Tensor | None = None) -> Batch:
    """The engine columns from repeated prompts, [B, R] response ids and their
    log-probs (zeros when the engine has none)."""
    prompt_ids, prompt_mask = prompts["input_ids"], prompts["attention_mask"]
    response_mask = response_mask_from_ids(responses, eos_id)
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_id))
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    if log_probs is None:
        log_probs = torch.zeros(responses.shape, dtype=torch.float32)
    log_probs = torch.where(response_mask.bool(), log_probs.float(), torch.zeros(()))
    return Batch({
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_length": response_mask.sum(-1),
        ROLLOUT_LOG_PROBS: log_probs,
    })


def generate_rows(engine, batch: Batch, opts: RolloutConfig, sync_s: float = 0.0) -> Batch:
    """n responses per prompt row (rows repeated interleaved: aabb), each carrying its
    prompt's other columns and the policy version of the weights that sampled it."""
    start = time.perf_counter()
    prompts = batch.repeat(opts.n, interleave=True)
    rollout = engine.generate(prompts.select("input_ids", "attention_mask"), opts)
    gen_s = time.perf_counter() - start
    out = prompts.drop("position_ids").update(rollout)
    out[POLICY_VERSION] = torch.full((len(out),), int(engine.policy_version),
                                     dtype=torch.long)
    out[TOKEN_VERSIONS] = uniform_token_versions(rollout["response_mask"],
                                                 engine.policy_version)
    lengths = rollout["response_length"].float()
    metrics = {
        "rollout/weight_sync_s": sync_s,
        "rollout/gen_s": gen_s,
        "rollout/tokens_per_s": float(lengths.sum()) / max(gen_s, 1e-9),
        "response_length/mean": float(lengths.mean()) if len(lengths) else 0.0,
        # the version every row of this call is stamped with (async/staleness/*)
        SAMPLED_VERSION: int(engine.policy_version),
    }
    out.meta = {**out.meta, "metrics": {k: float(v) for k, v in metrics.items()}}
    return out


def logprob_mismatch(rollout_log_probs: torch.Tensor, log_probs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's token probabilities are from the trainer's for the same
    tokens and weights version: mean and max |p_rollout - p_trainer| over tokens."""
    mask = mask.bool()
    if not mask.any():
        return {}
    diff = (rollout_log_probs.float().exp() - log_probs.float().exp()).abs()[mask]
    return {"rollout/probs_diff_mean": float(diff.mean()),
            "rollout/probs_diff_max": float(diff.max())}

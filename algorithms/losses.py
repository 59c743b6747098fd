"""Policy and value losses, their aggregation over tokens, the entropy, and the
off-policy importance weights (`behaviour_weights`) a policy loss takes as
`is_weights` when the samples came from older weights or another engine.

Shapes: `log_prob`, `old_log_prob`, `advantages`, `values`, ... are [B, T];
`mask` [B, T] is the response mask. Every loss returns `(loss, metrics)`:
`loss` a 0-dim tensor with gradient, `metrics` a dict of detached 0-dim
tensors (not floats: `.item()` would force a device sync on every call).

Data parallelism: each rank sees a slice of the batch. Pass the global
normalisers (`global_tokens`, `global_seqs`, from `local_normalizers` summed
over ranks) and each rank's loss becomes its share of the full-batch loss:
the rank losses sum to the unsplit loss. A gradient all-reduce that averages
(DDP) therefore needs the loss multiplied by the world size.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from hybridflow.algorithms.masked import masked_mean, masked_sum
from hybridflow.algorithms.registry import lookup
from hybridflow.core.tokens import entropy_from_logits  # noqa: F401  (re-export)

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
Count = torch.Tensor | float | int | None


def local_normalizers(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid tokens, sequences with at least one valid token) in this shard.

    Sum these over data-parallel ranks and pass them to `aggregate` as
    `global_tokens` / `global_seqs`.
    """
    return mask.sum(), (mask.sum(dim=-1) > 0).sum()


def _count(local: torch.Tensor, given: Count, like: torch.Tensor) -> torch.Tensor:
    """The normaliser to divide by: the global one if given, else the local one.

    clamp(min=1): with nothing valid the numerator is 0, and 0 / 1 = 0 keeps
    the loss finite (a rank whose shard is all padding contributes nothing).
    """
    n = local if given is None else given
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              global_tokens: Count = None, global_seqs: Count = None,
              norm_constant: float | None = None) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar.

    - token-mean: sum of valid values / number of valid tokens.
    - seq-mean-token-sum: per-sequence sum, mean over sequences.
    - seq-mean-token-mean: per-sequence mean, mean over sequences.
    - seq-mean-token-sum-norm: per-sequence sum, mean over sequences, divided
      by `norm_constant` (default T, the padded length of *this* tensor: with
      data parallelism pass a constant such as the max response length, as
      shards may be padded differently).
    Sequences with no valid token are left out of the sequence means.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    local_tokens, local_seqs = local_normalizers(mask)
    if mode == "token-mean":
        return masked_sum(values, mask) / _count(local_tokens, global_tokens, values)
    per_seq = masked_sum(values, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        # an empty sequence has sum 0, so it adds nothing to the numerator
        per_seq = per_seq / mask.sum(dim=-1).clamp(min=1).to(values.dtype)
    loss = per_seq.sum() / _count(local_seqs, global_seqs, values)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (values.shape[-1] if norm_constant is None else norm_constant)
    return loss


def _metric(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(x.detach().to(torch.float32), mask)


def _weighted(losses: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token losses times the off-policy weights (`behaviour_weights`); None leaves
    them untouched, so an uncorrected loss is bit-identical to one without the argument."""
    return losses if is_weights is None else losses * is_weights


def ppo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    clip_c: float = 3.0, mode: str = "token-mean", *, global_tokens: Count = None,
                    global_seqs: Count = None, norm_constant: float | None = None,
                    is_weights: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate with dual clip, all inputs [B, T].

    `ratio = exp(clamp(log_prob - old_log_prob, -20, 20))`,
    `max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))`, and where
    A < 0 additionally `min(-A * clip_c, .)` so a huge ratio on a bad action
    cannot dominate. Metrics: pg_clipfrac, ppo_kl (masked mean of old - new),
    pg_clipfrac_lower (fraction where the dual clip bites).
    """
    if clip_c <= 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    unclipped = -advantages * ratio
    clipped_ratio = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(unclipped, clipped_ratio)
    dual_bound = -advantages * clip_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(dual_bound, clipped), clipped)
    loss = aggregate(_weighted(losses, is_weights), mask, mode, global_tokens, global_seqs,
                     norm_constant)
    metrics = {
        "pg_clipfrac": _metric(clipped_ratio > unclipped, mask),
        "ppo_kl": _metric(old_log_prob - log_prob, mask),
        "pg_clipfrac_lower": _metric((clipped > dual_bound) & negative, mask),
    }
    return loss, metrics


def gspo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, clip_low: float = 3e-4, clip_high: float = 4e-4,
                     mode: str = "seq-mean-token-mean", *, global_tokens: Count = None,
                     global_seqs: Count = None, norm_constant: float | None = None,
                     is_weights: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: PPO clipping with a sequence-level importance ratio, inputs [B, T].

    `s_i = exp(masked mean_t (log_prob - old_log_prob))` (the length-normalised
    sequence ratio). Token-wise ratio `s_i * pi / sg(pi)`: its value is `s_i` on
    every token, its gradient that of `s_i * log_prob_t` (straight-through).
    The log ratio is clamped at 10 for stability. Default clip range and mode
    follow the GSPO paper. Metrics as `ppo_policy_loss` (no dual clip: lower 0).
    """
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped_ratio = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = torch.maximum(unclipped, clipped_ratio)
    loss = aggregate(_weighted(losses, is_weights), mask, mode, global_tokens, global_seqs,
                     norm_constant)
    metrics = {
        "pg_clipfrac": _metric(clipped_ratio > unclipped, mask),
        "ppo_kl": _metric(-log_ratio, mask),
        "pg_clipfrac_lower": torch.zeros((), device=loss.device),
    }
    return loss, metrics


def cispo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                      mode: str = "token-mean", *, global_tokens: Count = None,
                      global_seqs: Count = None, norm_constant: float | None = None,
                      is_weights: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: `-sg(clamp(ratio, 1 - clip_low, 1 + clip_high)) * A * log_prob`, inputs [B, T].

    The clipped ratio is a constant weight, so every token keeps a gradient
    (PPO drops clipped tokens). Metrics: pg_clipfrac (ratio clipped on either
    side), ppo_kl, pg_clipfrac_lower (ratio clipped at 1 - clip_low).
    """
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    losses = -weight * advantages * log_prob
    loss = aggregate(_weighted(losses, is_weights), mask, mode, global_tokens, global_seqs,
                     norm_constant)
    lower = ratio < 1.0 - clip_low
    metrics = {
        "pg_clipfrac": _metric(lower | (ratio > 1.0 + clip_high), mask),
        "ppo_kl": _metric(old_log_prob - log_prob, mask),
        "pg_clipfrac_lower": _metric(lower, mask),
    }
    return loss, metrics


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": ppo_policy_loss,
    "gspo": gspo_policy_loss,
    "cispo": cispo_policy_loss,
}


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as `name`; ValueError listing valid names otherwise."""
    return lookup(POLICY_LOSSES, name, "policy loss")


# ------------------------------------------------------- off-policy corrections
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")
IS_LEVELS = ("token", "sequence")
_LOG_CLAMP = 20.0  # exp(20) ~ 5e8: a diagnostic stays finite however stale the sample


def check_off_policy(correction: str, level: str = "token", cap: float = 2.0) -> None:
    """ValueError naming the actor config key when a correction setting is invalid."""
    if correction not in OFF_POLICY_CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {correction!r} (actor.off_policy); "
                         f"valid: {', '.join(OFF_POLICY_CORRECTIONS)}")
    if level not in IS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r} (actor.is_level); "
                         f"valid: {', '.join(IS_LEVELS)}")
    if correction == "decoupled" and level != "token":
        raise ValueError("actor.is_level=sequence applies to actor.off_policy=tis only: "
                         "decoupled PPO weighs and drops single tokens; set "
                         "actor.is_level=token")
    if not cap > 1.0:
        raise ValueError(f"the importance weight cap actor.is_cap must be > 1, got {cap}")


def behaviour_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      mask: torch.Tensor, correction: str = "tis", cap: float = 2.0,
                      level: str = "token") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached importance weights [B, T] of the proximal policy (`old_log_prob`, the
    trainer's weights before this update) over the behaviour policy that sampled the
    tokens (`rollout_log_prob`), to multiply a surrogate's per-token losses by.

    `w = exp(old - rollout)`; `level="sequence"` (tis only) takes
    `exp(sum over the sequence's masked tokens of (old - rollout))` on all its tokens.
    - tis: `min(w, cap)` (truncated importance sampling);
    - decoupled: `w`, or 0 where `w > cap` (the token is dropped).
    Metrics (masked means unless said): is_weight_mean (of the applied weight, a
    dropped token counting 0), is_weight_max (largest uncapped weight),
    truncated_frac (tis) or dropped_frac (decoupled): tokens whose weight exceeds
    `cap`; behav_kl: k3 estimate of KL(behaviour || proximal), `w_t - 1 - log w_t`
    per token (non-negative; its mean is unbiased under the behaviour's samples).
    """
    check_off_policy(correction, level, cap)
    if correction == "none":
        raise ValueError("behaviour_weights needs a correction ('tis' or 'decoupled')")
    valid = mask.bool()
    token_log_w = torch.where(valid, (old_log_prob - rollout_log_prob).detach().float(), 0.0)
    log_w = token_log_w
    if level == "sequence":
        log_w = token_log_w.sum(dim=-1, keepdim=True).expand_as(token_log_w)
    over = log_w > math.log(cap)
    if correction == "tis":  # exp(min(log w, log cap)): no overflow however stale
        weights = torch.exp(torch.clamp(log_w, max=math.log(cap)))
    else:
        weights = torch.where(over, 0.0, torch.exp(torch.clamp(log_w, max=math.log(cap))))
    raw = torch.exp(torch.clamp(log_w, -_LOG_CLAMP, _LOG_CLAMP))
    # k3 in float64 with expm1: near on-policy it is ~x^2/2, below float32's rounding
    token_log_w = torch.clamp(token_log_w, -_LOG_CLAMP, _LOG_CLAMP).double()
    largest = torch.where(valid, raw, 0.0).max() if raw.numel() else raw.new_zeros(())
    metrics = {
        "is_weight_mean": _metric(weights, mask),
        "is_weight_max": largest,
        ("truncated_frac" if correction == "tis" else "dropped_frac"): _metric(over, mask),
        "behav_kl": _metric(torch.expm1(token_log_w) - token_log_w, mask),
    }
    return weights.to(old_log_prob.dtype), metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float = 0.5, mode: str = "token-mean", *,
               global_tokens: Count = None, global_seqs: Count = None,
               norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, inputs [B, T].

    `0.5 * aggregate(max((v - R)^2, (clamp(v, old - clip, old + clip) - R)^2))`.
    Metric vf_clipfrac: fraction of tokens where the clipped error is larger.
    """
    clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
    err = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    losses = torch.maximum(err, err_clipped)
    loss = 0.5 * aggregate(losses, mask, mode, global_tokens, global_seqs, norm_constant)
    return loss, {"vf_clipfrac": _metric(err_clipped > err, mask)}

"""Policy and value losses, their aggregation over tokens, and the entropy.

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

from typing import Callable

import torch

from algorithms.masked import masked_mean, masked_sum
from algorithms.registry import lookup
from hybridflow.workers.sequences import entropy_from_logits  # noqa: F401  (re-export)

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


def ppo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    clip_c: float = 3.0, mode: str = "token-mean", *, global_tokens: Count = None,
                    global_seqs: Count = None, norm_constant: float | None = None,
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
    loss = aggregate(losses, mask, mode, global_tokens, global_seqs, norm_constant)
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
    loss = aggregate(losses, mask, mode, global_tokens, global_seqs, norm_constant)
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
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: `-sg(clamp(ratio, 1 - clip_low, 1 + clip_high)) * A * log_prob`, inputs [B, T].

    The clipped ratio is a constant weight, so every token keeps a gradient
    (PPO drops clipped tokens). Metrics: pg_clipfrac (ratio clipped on either
    side), ppo_kl, pg_clipfrac_lower (ratio clipped at 1 - clip_low).
    """
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    losses = -weight * advantages * log_prob
    loss = aggregate(losses, mask, mode, global_tokens, global_seqs, norm_constant)
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

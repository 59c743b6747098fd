"""Advantage estimators: GAE, GRPO (and Dr.GRPO), RLOO, REINFORCE++, ReMax.

Shapes: `B` sequences, `T` response tokens. `mask` [B, T] is the response mask
(1 = a real response token). Token-level inputs (`rewards`, `values`) are
[B, T]; sequence-level inputs (`scores`, `baseline`) are [B]; `group` is B ids
of any hashable type (a list of strings, a numpy array, an int tensor).

Every estimator returns `(advantages, returns)`, both [B, T] and zero where
`mask` is 0. Outcome estimators (GRPO, RLOO, ...) have no separate return and
give the advantages twice. No gradient flows out of here: advantages and
returns are constants for the losses that consume them.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import torch

from hybridflow.algorithms.masked import masked_mean, masked_var
from hybridflow.algorithms.registry import lookup

GroupIds = Union[Sequence, torch.Tensor]


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(x - mean) * rsqrt(var + 1e-8)` with the masked mean and unbiased variance.

    x, mask: [B, T]. Masked positions are shifted and scaled like the others
    (not zeroed); callers multiply by the mask. Needs >= 2 valid tokens.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return (x - mean) * torch.rsqrt(var + 1e-8)


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, backward over t.

    rewards, values, mask: [B, T]. `delta = r_t + gamma * V_next - V_t`,
    `A_t = delta + gamma * lam * A_next`. A masked token is skipped: V_next and
    A_next carry through it unchanged (so multi-turn observation tokens do not
    break the chain). `returns = A + values` before whitening; the advantages
    are `whiten(A, mask)`. Both are zero where mask is 0.
    """
    valid = mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    raw = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        next_adv = torch.where(valid[:, t], adv_t, next_adv)
        raw[:, t] = next_adv
    m = mask.to(values.dtype)
    returns = (raw + values) * m
    return whiten(raw, mask) * m, returns


def _group_members(group: GroupIds, batch_size: int) -> list[list[int]]:
    """Indices of each group, in order of first appearance."""
    ids = group.tolist() if hasattr(group, "tolist") else list(group)
    if len(ids) != batch_size:
        raise ValueError(f"group has {len(ids)} ids but scores has {batch_size} entries")
    members: dict = {}
    for i, gid in enumerate(ids):
        members.setdefault(gid, []).append(i)
    return list(members.values())


def _group_stats(scores: torch.Tensor,
                 group: GroupIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased std and size, each [B].

    A group of one sample gets mean 0 and std 1, so its score passes through
    unchanged (there is nothing to compare it with).
    """
    mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    size = torch.ones_like(scores)
    for idx in _group_members(group, scores.shape[0]):
        if len(idx) > 1:
            rows = torch.tensor(idx, device=scores.device)
            chosen = scores[rows]
            mean[rows], std[rows] = chosen.mean(), chosen.std()
            size[rows] = float(len(idx))
    return mean, std, size


def zero_std_fraction(scores: torch.Tensor, group: GroupIds) -> float:
    """The share of groups (of two or more samples) whose scores are all equal: their
    group-relative advantages are 0, so they teach nothing (TRL logs it as
    `frac_reward_zero_std`). 0.0 when no group has two samples."""
    groups = [idx for idx in _group_members(group, scores.shape[0]) if len(idx) > 1]
    if not groups:
        return 0.0
    flat = scores.reshape(scores.shape[0], -1).sum(-1) if scores.ndim > 1 else scores
    same = sum(1 for idx in groups if bool((flat[idx] == flat[idx[0]]).all()))
    return same / len(groups)


def _as_float(scores: torch.Tensor) -> torch.Tensor:
    return scores if scores.is_floating_point() else scores.to(torch.get_default_dtype())


@torch.no_grad()
def grpo(scores: torch.Tensor, group: GroupIds, mask: torch.Tensor,
         eps: float = 1e-6, norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage: `(s - mean_g) / (std_g + eps)`, broadcast over tokens.

    scores: [B]; group: B ids; mask: [B, T]. Unbiased std within a group; a
    group of one has mean 0 and std 1. `norm_by_std=False` gives `s - mean_g`
    (Dr.GRPO). Result [B, T], multiplied by mask.
    """
    scores = _as_float(scores)
    mean, std, _ = _group_stats(scores, group)
    adv = (scores - mean) / (std + eps) if norm_by_std else scores - mean
    adv = adv[:, None] * mask.to(scores.dtype)
    return adv, adv


def dr_grpo(scores: torch.Tensor, group: GroupIds, mask: torch.Tensor,
            eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO: `grpo` without the division by the group std (`s - mean_g`)."""
    return grpo(scores, group, mask, eps=eps, norm_by_std=False)


@torch.no_grad()
def rloo(scores: torch.Tensor, group: GroupIds,
         mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baseline: `(s - mean_g) * n / (n - 1)` for a group of n > 1.

    This equals `s - mean of the other n - 1 scores`. scores: [B]; a group of
    one keeps `s`. Result [B, T], multiplied by mask.
    """
    scores = _as_float(scores)
    mean, _, size = _group_stats(scores, group)
    # (size - 1).clamp(min=1): a group of one has mean 0 and factor 1 / 1.
    adv = (scores - mean) * size / (size - 1).clamp(min=1)
    adv = adv[:, None] * mask.to(scores.dtype)
    return adv, adv


@torch.no_grad()
def reinforce_pp(rewards: torch.Tensor, mask: torch.Tensor,
                 gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return `G_t = r_t + gamma * G_next`, then whitened.

    rewards, mask: [B, T]. A masked token is skipped: the running return
    carries through it unchanged (no reward added, no discount) and the return
    there is 0. Advantages `whiten(returns, mask) * mask`.
    """
    valid = mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    return whiten(returns, mask) * mask.to(rewards.dtype), returns


@torch.no_grad()
def reinforce_pp_baseline(scores: torch.Tensor, group: GroupIds,
                          mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: `s - mean_g`, broadcast, then whitened.

    scores: [B]; a group of one has mean 0 (keeps `s`), as in `grpo`. The
    whitening is over the whole batch's valid tokens. Result [B, T] times mask.
    """
    scores = _as_float(scores)
    mean, _, _ = _group_stats(scores, group)
    m = mask.to(scores.dtype)
    centred = (scores - mean)[:, None] * m
    adv = whiten(centred, mask) * m
    return adv, adv


@torch.no_grad()
def remax(rewards: torch.Tensor, baseline: torch.Tensor,
          mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: reward-to-go minus the greedy rollout's score.

    rewards, mask: [B, T]; baseline: [B] (score of the greedy response).
    `returns_t = sum_{t' >= t} mask_t' * r_t'`; advantages `returns - baseline`
    on valid tokens. Both zero where mask is 0.
    """
    m = mask.to(rewards.dtype)
    kept = torch.where(mask.bool(), rewards, torch.zeros_like(rewards))
    returns = kept.flip(-1).cumsum(-1).flip(-1) * m
    return (returns - baseline[:, None]) * m, returns


ADVANTAGES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": gae,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
}


def get_advantage(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The estimator registered as `name`; ValueError listing valid names otherwise."""
    return lookup(ADVANTAGES, name, "advantage estimator")

"""KL estimators between the policy and the reference, and KL controllers.

`log_prob`, `ref_log_prob`, `mask`: [B, T], log-probabilities of the sampled
tokens. Estimators of KL(pi || ref) per token (Schulman's k1/k2/k3):

- k1 (`kl`):  lp - ref                               unbiased, high variance
- abs:        |lp - ref|
- k2 (`mse`): 0.5 * (lp - ref)^2
- k3 (`low_var_kl`): d = clamp(ref - lp, -20, 20); clamp(exp(d) - d - 1, -10, 10)
- any kind with a trailing `+` (`k3+`, `k1+`, ...): the value of that kind,
  the gradient of k2 (straight-through). k2's gradient, (lp - ref) * dlp, is
  the unbiased gradient of KL when used as a loss, while k3's is not.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.masked import masked_mean

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
_BASE_KINDS = ("k1", "abs", "k2", "k3")
KL_KINDS = _BASE_KINDS + tuple(_ALIASES) + tuple(k + "+" for k in _BASE_KINDS + tuple(_ALIASES))


def _k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


def _estimate(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, base: str) -> torch.Tensor:
    if base == "k1":
        return log_prob - ref_log_prob
    if base == "abs":
        return (log_prob - ref_log_prob).abs()
    if base == "k2":
        return _k2(log_prob, ref_log_prob)
    # k3: clamps keep exp finite and bound the penalty of a wildly off token
    d = torch.clamp(ref_log_prob - log_prob, -20.0, 20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
               kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate [B, T] of the given `kind` (see module docstring)."""
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")
    straight_through = kind.endswith("+")
    base = kind.rstrip("+")
    base = _ALIASES.get(base, base)
    value = _estimate(log_prob, ref_log_prob, base)
    if not straight_through or base == "k2":
        return value
    grad_carrier = _k2(log_prob, ref_log_prob)
    return grad_carrier - grad_carrier.detach() + value.detach()


@dataclass
class FixedKL:
    """A constant KL coefficient `beta`; `update` is a no-op."""

    beta: float

    def update(self, kl: float, n_steps: int) -> None:
        """Nothing to adapt: the coefficient is fixed."""


class AdaptiveKL:
    """Proportional controller steering the measured KL towards `target`.

    `error = clip(kl / target - 1, -0.2, 0.2)`, `beta *= 1 + error * n_steps / horizon`
    (Ziegler et al. 2019). `n_steps` is the number of samples the KL was
    measured on.
    """

    def __init__(self, init_beta: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKL needs target > 0 and horizon > 0, "
                             f"got {target}, {horizon}")
        self.beta = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, kl: float, n_steps: int) -> None:
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * n_steps / self.horizon


KLController = FixedKL | AdaptiveKL


@torch.no_grad()
def apply_kl_in_reward(token_rewards: torch.Tensor, log_prob: torch.Tensor,
                       ref_log_prob: torch.Tensor,
                       mask: torch.Tensor, controller: KLController,
                       kind: str = "k1") -> tuple[torch.Tensor, float]:
    """Penalise token rewards by the KL to the reference: `r - beta * kl * mask`.

    All tensors [B, T]. Uses the controller's current `beta`, then updates
    the controller with the measured KL and `n_steps = B`. The measured KL is
    the mean over sequences of each sequence's masked mean KL; sequences with
    no valid token are left out. Returns (penalised rewards [B, T], measured KL).
    """
    kld = torch.where(mask.bool(), kl_penalty(log_prob, ref_log_prob, kind),
                      torch.zeros_like(log_prob))
    rewards = token_rewards - controller.beta * kld
    nonempty = mask.sum(dim=-1) > 0
    per_seq = masked_mean(kld, mask, dim=-1)
    measured = float(per_seq[nonempty].mean().item()) if bool(nonempty.any()) else 0.0
    controller.update(measured, n_steps=token_rewards.shape[0])
    return rewards, measured

"""Function nodes shared by the graphs: the math of `algorithms/` adapted to batches.

Each is a plain function over a Batch, declared with `@node_fn` (the keys it reads
and writes, and whether it may run on shards). The math itself lives in
`algorithms/`; these adapters only pick columns and name the outputs.
"""
from __future__ import annotations

import torch

from algorithms import advantages as adv
from algorithms.kl import KL_KINDS, AdaptiveKL, FixedKL, apply_kl_in_reward
from hybridflow import Batch, node_fn

__all__ = ["grpo_advantages", "rloo_advantages", "reinforce_pp_advantages",
           "reinforce_pp_baseline_advantages", "remax_advantages", "gae_advantages",
           "KLInReward", "AdaptiveKLInReward", "kl_in_reward", "scores_to_rewards",
           "response_loss_mask"]


def _out(**tensors) -> Batch:
    return Batch(tensors)


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def grpo_advantages(batch: Batch, norm_by_std: bool = True, eps: float = 1e-6) -> Batch:
    """GRPO (Dr.GRPO with norm_by_std=False): scores normalised within each prompt's group."""
    a, _ = adv.grpo(batch["scores"], batch["uid"], batch["response_mask"], eps, norm_by_std)
    return _out(advantages=a)


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def rloo_advantages(batch: Batch) -> Batch:
    """RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
    a, _ = adv.rloo(batch["scores"], batch["uid"], batch["response_mask"])
    return _out(advantages=a)


@node_fn(reads=("token_level_rewards", "response_mask"), writes=("advantages", "returns"))
def reinforce_pp_advantages(batch: Batch, gamma: float = 1.0) -> Batch:
    """REINFORCE++: discounted returns whitened over the whole batch."""
    a, r = adv.reinforce_pp(batch["token_level_rewards"], batch["response_mask"], gamma)
    return _out(advantages=a, returns=r)


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",))
def reinforce_pp_baseline_advantages(batch: Batch) -> Batch:
    """REINFORCE++ with a group-mean baseline, whitened over the whole batch."""
    a, _ = adv.reinforce_pp_baseline(batch["scores"], batch["uid"], batch["response_mask"])
    return _out(advantages=a)


@node_fn(reads=("token_level_rewards", "baseline_scores", "response_mask"),
         writes=("advantages", "returns"), rows=True)
def remax_advantages(batch: Batch) -> Batch:
    """ReMax: reward-to-go minus the score of the greedy response to the same prompt."""
    a, r = adv.remax(batch["token_level_rewards"], batch["baseline_scores"].float(),
                     batch["response_mask"])
    return _out(advantages=a, returns=r)


@node_fn(reads=("baseline_scores",), writes=("baseline_scores",),
         overwrites=("baseline_scores",))
def repeat_baseline(batch: Batch, n: int) -> Batch:
    """One greedy score per prompt -> one per sample (n samples a prompt, interleaved,
    as `actor.generate` lays them out)."""
    return _out(baseline_scores=batch["baseline_scores"].float().repeat_interleave(n))


@node_fn(reads=("token_level_rewards", "values", "response_mask"),
         writes=("advantages", "returns"))
def gae_advantages(batch: Batch, gamma: float = 1.0, lam: float = 1.0) -> Batch:
    """PPO's GAE over token rewards and critic values; advantages whitened batch-wide."""
    a, r = adv.gae(batch["token_level_rewards"], batch["values"], batch["response_mask"],
                   gamma, lam)
    return _out(advantages=a, returns=r)


@node_fn(reads=("token_level_scores",), writes=("token_level_rewards",), rows=True)
def scores_to_rewards(batch: Batch) -> Batch:
    """Token rewards are the scores themselves (no KL penalty in the reward)."""
    return _out(token_level_rewards=batch["token_level_scores"])


def kl_in_reward(kind: str = "k1", beta: float = 0.001, target: float | None = None,
                 horizon: float = 10000.0) -> "KLInReward":
    """The KL-in-reward node: fixed beta, or adaptive towards `target` when given."""
    if target:
        return AdaptiveKLInReward(kind, beta, target, horizon)
    return KLInReward(kind, beta)


class KLInReward:
    """Token rewards = scores - beta * KL(actor || reference) with a fixed beta. It has
    no state, so on Ray it runs on a worker and the tensors stay off the driver."""

    def __init__(self, kind: str = "k1", beta: float = 0.001, target: float | None = None,
                 horizon: float = 10000.0):
        if kind not in KL_KINDS:  # at build time, before any worker starts
            raise ValueError(f"unknown KL kind {kind!r} (algorithm.kl_kind); valid kinds: "
                             f"{', '.join(KL_KINDS)}")
        self.kind = kind
        self.controller = AdaptiveKL(beta, target, horizon) if target else FixedKL(beta)
        self.__name__ = "kl_in_reward"
        node_fn(reads=("token_level_scores", "old_log_probs", "ref_log_prob",
                       "response_mask"), writes=("token_level_rewards",))(self)

    def __call__(self, batch: Batch) -> Batch:
        beta = self.controller.beta
        rewards, kl = apply_kl_in_reward(batch["token_level_scores"], batch["old_log_probs"],
                                         batch["ref_log_prob"], batch["response_mask"],
                                         self.controller, self.kind)
        out = _out(token_level_rewards=rewards)
        out.meta["metrics"] = {"actor/reward_kl_penalty": kl,
                               "actor/reward_kl_penalty_coeff": float(beta)}
        return out


class AdaptiveKLInReward(KLInReward):
    """KL in reward with a coefficient adapted each step: state across steps, so it
    runs on the driver, and the loop checkpoints the coefficient."""

    def state_dict(self) -> dict:
        """The coefficient, saved in checkpoints so a resumed run goes on with it."""
        return {"beta": self.controller.beta}

    def load_state_dict(self, state: dict) -> None:
        self.controller.beta = float(state["beta"])



@node_fn(reads=("scores", "uid"), forwards=True)
def drop_uniform_groups(batch: Batch) -> Batch:
    """DAPO's dynamic-sampling filter: drop every group whose scores are all equal
    (all right or all wrong), since its advantages would all be zero."""
    scores, uids = batch["scores"].tolist(), list(batch["uid"])
    by_group: dict = {}
    for score, uid in zip(scores, uids):
        by_group.setdefault(uid, set()).add(score)
    keep = [i for i, uid in enumerate(uids) if len(by_group[uid]) > 1]
    out = batch.take(keep)
    dropped = sum(1 for values in by_group.values() if len(values) == 1)
    out.meta = {"metrics": {"dapo/dropped_groups_total": float(dropped),
                            "dapo/kept_groups_total": float(len(by_group) - dropped)}}
    return out


@node_fn(reads=("scores", "response_length"), writes=("scores",), overwrites=("scores",),
         rows=True)
def overlong_penalty(batch: Batch, max_length: int, buffer: int, factor: float = 1.0) -> Batch:
    """DAPO's soft overlong punishment: responses longer than `max_length - buffer`
    lose up to `factor`, linearly over the buffer."""
    length = batch["response_length"].float()
    expected = max_length - buffer
    penalty = ((expected - length) / max(buffer, 1) * factor).clamp(max=0.0)
    out = _out(scores=batch["scores"].float() + penalty)
    out.meta = {"metrics": {"dapo/overlong_frac": float((length > expected).float().mean())
                            if len(length) else 0.0}}
    return out


# ---- supervised targets from a rollout (docs/functions.md)
@node_fn(reads=("prompts", "input_ids", "response_mask"), writes=("loss_mask",), rows=True)
def response_loss_mask(batch: Batch) -> Batch:
    """`loss_mask` [B, P + R] for `actor.sft` from `actor.generate`'s output: 1 on the
    response tokens (EOS included) of `input_ids` = [prompt | response], 0 on the
    prompt and padding. E.g. fine-tune on the responses a filter kept."""
    prompt_width = batch["prompts"].shape[1]
    mask = torch.zeros_like(batch["input_ids"], dtype=torch.long)
    mask[:, prompt_width:] = batch["response_mask"].long()
    return _out(loss_mask=mask)

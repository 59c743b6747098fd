"""Function nodes and losses shared by the graphs: the math of `algorithms/` adapted
to batches.

Each function node is a plain function over a Batch, declared with `@node_fn` (the
keys it reads and writes, and whether it may run on shards). Each loss is passed to
a training node (`g.call("actor.update", ..., loss=ops.policy_loss(cfg.actor))`) and
declared with `@loss_fn` (the keys it reads). The math itself lives in
`algorithms/`; these adapters only pick columns and name the outputs. On import this
module registers the default losses of `actor.update`, `actor.sft` and
`critic.update` (today's config-chosen losses) for graphs that pass none, and the
names those losses read from config (policy loss, KL kind, aggregation mode,
off-policy correction), which `build_config` checks before launch.

Masks: advantages, KL and losses count the batch's training mask (`_mask` here,
`out.mask` in a loss): an agent rollout's `loss_mask` (the model's tokens, not the
environment's observations) when the batch has one, else `response_mask`.
"""
from __future__ import annotations

import torch

from hybridflow.algorithms import advantages as adv
from hybridflow.algorithms.kl import KL_KINDS, AdaptiveKL, FixedKL, apply_kl_in_reward, kl_penalty
from hybridflow.algorithms.losses import (AGG_MODES, OFF_POLICY_CORRECTIONS, POLICY_LOSSES,
                                          aggregate, behaviour_weights, check_off_policy,
                                          get_policy_loss, value_loss)
from hybridflow.algorithms.masked import masked_mean
from hybridflow import (SHAPED_REWARD_MEAN, ZERO_STD_GROUPS, Batch, loss_fn, node_fn,
                        register_default_loss, register_setting_names, training_mask)

__all__ = ["grpo_advantages", "rloo_advantages", "reinforce_pp_advantages",
           "reinforce_pp_baseline_advantages", "remax_advantages", "gae_advantages",
           "KLInReward", "AdaptiveKLInReward", "kl_in_reward", "scores_to_rewards",
           "PolicyLoss", "policy_loss", "ppo_loss", "gspo_loss", "cispo_loss", "tis_loss",
           "decoupled_ppo_loss", "sft_loss",
           "ValueLoss", "critic_value_loss", "response_loss_mask"]


def _out(**tensors) -> Batch:
    return Batch(tensors)


def _group_out(batch: Batch, **tensors) -> Batch:
    """A group-relative advantage's output, with the share of groups whose scores are
    all equal (zero advantage: nothing learned from them) as a step metric."""
    out = Batch(tensors)
    out.meta["metrics"] = {ZERO_STD_GROUPS: adv.zero_std_fraction(batch["scores"],
                                                                  batch["uid"])}
    return out


_MASK = ("loss_mask",)  # each node reading response_mask also takes an agent's loss_mask


def _mask(batch: Batch):
    return training_mask(batch)


@node_fn(reads=("scores", "uid", "response_mask"), optional=_MASK, writes=("advantages",),
         group_by="uid")
def grpo_advantages(batch: Batch, norm_by_std: bool = True, eps: float = 1e-6) -> Batch:
    """GRPO (Dr.GRPO with norm_by_std=False): scores normalised within each prompt's group."""
    a, _ = adv.grpo(batch["scores"], batch["uid"], _mask(batch), eps, norm_by_std)
    return _group_out(batch, advantages=a)


@node_fn(reads=("scores", "uid", "response_mask"), optional=_MASK, writes=("advantages",),
         group_by="uid")
def rloo_advantages(batch: Batch) -> Batch:
    """RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
    a, _ = adv.rloo(batch["scores"], batch["uid"], _mask(batch))
    return _group_out(batch, advantages=a)


@node_fn(reads=("token_level_rewards", "response_mask"), optional=_MASK,
         writes=("advantages", "returns"))
def reinforce_pp_advantages(batch: Batch, gamma: float = 1.0) -> Batch:
    """REINFORCE++: discounted returns whitened over the whole batch."""
    a, r = adv.reinforce_pp(batch["token_level_rewards"], _mask(batch), gamma)
    return _out(advantages=a, returns=r)


@node_fn(reads=("scores", "uid", "response_mask"), optional=_MASK, writes=("advantages",))
def reinforce_pp_baseline_advantages(batch: Batch) -> Batch:
    """REINFORCE++ with a group-mean baseline, whitened over the whole batch."""
    a, _ = adv.reinforce_pp_baseline(batch["scores"], batch["uid"], _mask(batch))
    return _group_out(batch, advantages=a)


@node_fn(reads=("token_level_rewards", "baseline_scores", "response_mask"), optional=_MASK,
         writes=("advantages", "returns"), rows=True)
def remax_advantages(batch: Batch) -> Batch:
    """ReMax: reward-to-go minus the score of the greedy response to the same prompt."""
    a, r = adv.remax(batch["token_level_rewards"], batch["baseline_scores"].float(),
                     _mask(batch))
    return _out(advantages=a, returns=r)


@node_fn(reads=("baseline_scores",), writes=("baseline_scores",),
         overwrites=("baseline_scores",))
def repeat_baseline(batch: Batch, n: int) -> Batch:
    """One greedy score per prompt -> one per sample (n samples a prompt, interleaved,
    as `actor.generate` lays them out)."""
    return _out(baseline_scores=batch["baseline_scores"].float().repeat_interleave(n))


@node_fn(reads=("token_level_rewards", "values", "response_mask"), optional=_MASK,
         writes=("advantages", "returns"))
def gae_advantages(batch: Batch, gamma: float = 1.0, lam: float = 1.0) -> Batch:
    """PPO's GAE over token rewards and critic values; advantages whitened batch-wide."""
    a, r = adv.gae(batch["token_level_rewards"], batch["values"], _mask(batch),
                   gamma, lam)
    return _out(advantages=a, returns=r)


def _with_reward_metric(out: Batch, per_response: torch.Tensor, **metrics) -> Batch:
    """`out` with `critic/rewards/mean`: the mean reward of a response as the update
    will optimise it, after this node's shaping (what the progress bar shows)."""
    mean = float(per_response.float().mean()) if len(per_response) else 0.0
    out.meta["metrics"] = {SHAPED_REWARD_MEAN: mean, **metrics}
    return out


@node_fn(reads=("token_level_scores",), writes=("token_level_rewards",), rows=True)
def scores_to_rewards(batch: Batch) -> Batch:
    """Token rewards are the scores themselves (no KL penalty in the reward)."""
    scores = batch["token_level_scores"]
    return _with_reward_metric(_out(token_level_rewards=scores), scores.sum(-1))


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
                       "response_mask"), optional=_MASK, writes=("token_level_rewards",))(self)

    def __call__(self, batch: Batch) -> Batch:
        beta = self.controller.beta
        rewards, kl = apply_kl_in_reward(batch["token_level_scores"], batch["old_log_probs"],
                                         batch["ref_log_prob"], _mask(batch),
                                         self.controller, self.kind)
        per_response = (rewards * _mask(batch)).sum(-1)
        return _with_reward_metric(_out(token_level_rewards=rewards), per_response,
                                   **{"actor/reward_kl_penalty": kl,
                                      "actor/reward_kl_penalty_coeff": float(beta)})


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
    # `_total` (metric_names.SUMMED_SUFFIX): counts, summed over a gather's rounds
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
    scores = batch["scores"].float() + penalty
    overlong = float((length > expected).float().mean()) if len(length) else 0.0
    return _with_reward_metric(_out(scores=scores), scores,
                               **{"dapo/overlong_frac": overlong})


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


# ------------------------------------------------------------------------- losses
class PolicyLoss:
    """The actor's loss, as verl's actor computes it: a policy-gradient surrogate
    (`algorithms/losses.py`: ppo with dual clip, gspo or cispo), minus an entropy
    bonus when `entropy_coeff` is set, plus a KL-to-reference term when `kl_coef` is
    set (the term reads `ref_log_prob`). Metrics: pg_loss and the surrogate's
    (pg_clipfrac, ppo_kl, pg_clipfrac_lower), entropy, kl_loss.

    Off-policy correction (`off_policy` "tis" or "decoupled"; the loss then reads
    `rollout_log_probs`, the behaviour policy's): the surrogate's per-token losses,
    taken against `old_log_probs` (the proximal policy), are weighted by
    `behaviour_weights` (capped at `is_cap`; per token, or per sequence with
    `is_level="sequence"` under tis). Metrics under off_policy/: is_weight_mean,
    is_weight_max, truncated_frac or dropped_frac, behav_kl."""

    def __init__(self, kind: str = "ppo", clip_low: float = 0.2, clip_high: float = 0.2,
                 clip_c: float = 3.0, agg: str = "token-mean", entropy_coeff: float = 0.0,
                 kl_coef: float | None = None, kl_type: str = "low_var_kl",
                 off_policy: str = "none", is_level: str = "token", is_cap: float = 2.0):
        self.surrogate = get_policy_loss(kind)  # unknown names fail at graph build time
        if agg not in AGG_MODES:
            raise ValueError(f"unknown loss aggregation {agg!r} (actor.loss_agg_mode); "
                             f"valid modes: {', '.join(AGG_MODES)}")
        if kl_coef is not None and kl_type not in KL_KINDS:
            raise ValueError(f"unknown KL kind {kl_type!r} (actor.kl_loss_type); valid "
                             f"kinds: {', '.join(KL_KINDS)}")
        check_off_policy(off_policy, is_level, is_cap)
        self.kind, self.agg, self.entropy_coeff = kind, agg, entropy_coeff
        self.clip = {"clip_low": clip_low, "clip_high": clip_high,
                     **({"clip_c": clip_c} if kind == "ppo" else {})}
        self.kl_coef, self.kl_type = kl_coef, kl_type
        self.off_policy, self.is_level, self.is_cap = off_policy, is_level, float(is_cap)
        self.__name__ = f"{kind}_loss"
        loss_fn(reads=("old_log_probs", "advantages")
                + (("rollout_log_probs",) if self.corrected else ())
                + (("ref_log_prob",) if kl_coef is not None else ()))(self)

    @property
    def corrected(self) -> bool:
        """True when the loss weighs tokens by the behaviour policy (reads its log-probs)."""
        return self.off_policy != "none"

    def __repr__(self) -> str:
        kl = f", kl={self.kl_type}*{self.kl_coef}" if self.kl_coef is not None else ""
        ent = f", entropy={self.entropy_coeff}" if self.entropy_coeff else ""
        level = f"{self.is_level}, " if self.off_policy == "tis" else ""
        off = f", {self.off_policy}({level}cap={self.is_cap})" if self.corrected else ""
        return f"{self.__name__}({self.agg}{ent}{kl}{off})"

    def _behaviour_weights(self, micro: Batch, mask, share) -> tuple[dict, dict]:
        """({} or {"is_weights": w}) for the surrogate, and the off_policy/ metrics as
        this micro-batch's share (is_weight_max: its largest weight times its share,
        since the trainer sums metrics over micro-batches and ranks)."""
        if not self.corrected:
            return {}, {}
        weights, metrics = behaviour_weights(micro["old_log_probs"], micro["rollout_log_probs"],
                                             mask, self.off_policy, self.is_cap, self.is_level)
        return {"is_weights": weights}, {f"off_policy/{k}": v * share
                                         for k, v in metrics.items()}

    def __call__(self, micro: Batch, out):
        mask = out.mask  # the training mask: an agent's model tokens only
        logp = out.log_probs
        agg = dict(mode=self.agg, global_tokens=out.tokens, global_seqs=out.seqs,
                   norm_constant=float(mask.shape[1]))
        share = out.share
        weighting, off_metrics = self._behaviour_weights(micro, mask, share)
        pg_loss, pg_metrics = self.surrogate(logp, micro["old_log_probs"],
                                             micro["advantages"], mask, **self.clip, **agg,
                                             **weighting)
        loss = pg_loss
        parts = {"pg_loss": pg_loss, **{k: v * share for k, v in pg_metrics.items()},
                 **off_metrics}
        if self.entropy_coeff != 0:
            entropy = aggregate(out.entropy(grad=True), mask, **agg)
            loss = loss - self.entropy_coeff * entropy
            parts["entropy"] = entropy
        else:
            parts["entropy"] = masked_mean(out.entropy(grad=False), mask) * share
        if self.kl_coef is not None:
            kl = aggregate(kl_penalty(logp, micro["ref_log_prob"], self.kl_type), mask, **agg)
            loss = loss + self.kl_coef * kl
            parts["kl_loss"] = kl
        return loss, parts


def policy_loss(actor, kind: str | None = None, off_policy: str | None = None,
                is_level: str | None = None) -> PolicyLoss:
    """The actor's loss from its config section: `actor.policy_loss` (or `kind`), its
    clip range, aggregation, entropy bonus, KL loss (`actor.use_kl_loss`) and
    off-policy correction (`actor.off_policy`, `actor.is_level`, `actor.is_cap`; the
    arguments, when given, override the config's)."""
    return PolicyLoss(kind or actor.policy_loss, actor.clip_low, actor.clip_high,
                      actor.clip_c, actor.loss_agg_mode, actor.entropy_coeff,
                      actor.kl_loss_coef if actor.use_kl_loss else None, actor.kl_loss_type,
                      off_policy or actor.off_policy, is_level or actor.is_level, actor.is_cap)


def ppo_loss(actor) -> PolicyLoss:
    """Clipped PPO surrogate with dual clip (`actor.clip_low/clip_high/clip_c`)."""
    return policy_loss(actor, "ppo")


def gspo_loss(actor) -> PolicyLoss:
    """GSPO: PPO clipping on the length-normalised sequence ratio."""
    return policy_loss(actor, "gspo")


def cispo_loss(actor) -> PolicyLoss:
    """CISPO: the clipped ratio as a constant weight on `A * log_prob`."""
    return policy_loss(actor, "cispo")


def tis_loss(actor) -> PolicyLoss:
    """`actor.policy_loss` with truncated importance sampling towards the behaviour
    policy whatever `actor.off_policy` says (`actor.is_level`, `actor.is_cap`)."""
    return policy_loss(actor, off_policy="tis")


def decoupled_ppo_loss(actor) -> PolicyLoss:
    """Decoupled PPO: the PPO surrogate against the proximal policy (`old_log_probs`)
    weighted by the behaviour's importance weight, tokens above `actor.is_cap` dropped."""
    return policy_loss(actor, "ppo", off_policy="decoupled", is_level="token")


@loss_fn()
def sft_loss(micro: Batch, out):
    """Token-mean negative log-likelihood of the target tokens (`actor.sft`)."""
    loss = -out.mean(out.log_probs)
    return loss, {"sft_loss": loss}


class ValueLoss:
    """The critic's clipped value loss (`hybridflow.algorithms.losses.value_loss`); metrics vf_loss,
    vf_clipfrac and values/mean."""

    def __init__(self, clip: float = 0.5, agg: str = "token-mean"):
        if agg not in AGG_MODES:
            raise ValueError(f"unknown loss aggregation {agg!r} (critic.loss_agg_mode); "
                             f"valid modes: {', '.join(AGG_MODES)}")
        self.clip, self.agg, self.__name__ = clip, agg, "value_loss"
        loss_fn(reads=("values", "returns"))(self)

    def __repr__(self) -> str:
        return f"value_loss(clip={self.clip}, {self.agg})"

    def __call__(self, micro: Batch, out):
        mask = out.mask
        vpreds = out.values
        loss, metrics = value_loss(vpreds, micro["values"], micro["returns"], mask,
                                   clip=self.clip, mode=self.agg, global_tokens=out.tokens,
                                   global_seqs=out.seqs, norm_constant=float(mask.shape[1]))
        share = out.share
        return loss, {"vf_loss": loss, "vf_clipfrac": metrics["vf_clipfrac"] * share,
                      "values/mean": masked_mean(vpreds.detach(), mask) * share}


def critic_value_loss(critic) -> ValueLoss:
    """The critic's loss from its config section (`critic.cliprange_value`, agg mode)."""
    return ValueLoss(critic.cliprange_value, critic.loss_agg_mode)


# calls made without loss=... keep today's behaviour: the loss chosen from config
register_default_loss("actor.update", policy_loss)
register_default_loss("actor.sft", lambda actor: sft_loss)
register_default_loss("critic.update", critic_value_loss)
# the names those losses take from config, checked by the engine before launch
register_setting_names("policy loss", sorted(POLICY_LOSSES))
register_setting_names("KL kind", KL_KINDS)
register_setting_names("loss aggregation mode", AGG_MODES)
register_setting_names("off-policy correction", OFF_POLICY_CORRECTIONS)

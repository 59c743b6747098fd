"""PPO: a critic estimates values, GAE turns token rewards into advantages, and the
reward carries a KL penalty to the reference policy (or the actor's loss does, with
`actor.use_kl_loss=true algorithm.kl_in_reward=false`)."""
from dataclasses import dataclass

from hybridflow.algorithms.kl import KL_KINDS
from hybridflow import Graph, above, at_least, checked, one_of, probability

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class PPOOptions:
    """The `algorithm` section of this graph."""
    gamma: float = checked(1.0, probability)  # discount of the token rewards
    lam: float = checked(1.0, probability)    # GAE's lambda
    kl_in_reward: bool = True                 # false: no KL penalty in the reward
    kl_kind: str = checked("k1", one_of(*KL_KINDS, what="KL kind"))
    kl_coef: float = checked(0.001, at_least(0))           # the penalty's beta (initial)
    kl_target: float | None = checked(None, above(0))      # set: adapt beta towards it


ALGORITHM = PPOOptions


def defaults() -> dict:
    return embedded_defaults(rollout={"n": 4})


def build(cfg) -> Graph:
    a = cfg.algorithm
    g = Graph("ppo")
    prompts = g.source("prompts")
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    values = g.call("critic.values", rollout)
    score = g.call("reward.score", rollout)
    if a.kl_in_reward:
        kl = ops.kl_in_reward(a.kl_kind, a.kl_coef, a.kl_target)
        rewards = g.fn(kl, rollout, score, old, ref)
    else:
        rewards = g.fn(ops.scores_to_rewards, score)
    adv = g.fn(ops.gae_advantages, rollout, values, rewards, gamma=a.gamma, lam=a.lam)
    g.call("critic.update", rollout, values, adv, loss=ops.critic_value_loss(cfg.critic))
    g.call("actor.update", rollout, old, ref, adv, loss=ops.policy_loss(cfg.actor))
    return g

"""PPO: a critic estimates values, GAE turns token rewards into advantages, and the
reward carries a KL penalty to the reference policy (or the actor's loss does, with
`actor.use_kl_loss=true algorithm.kl_in_reward=false`)."""
from hybridflow import Graph

from graphs import ops
from graphs.common import embedded_defaults


def defaults() -> dict:
    return embedded_defaults(**{"rollout": {"n": 4},
            "algorithm": {"gamma": 1.0, "lam": 1.0, "kl_in_reward": True,
                          "kl_kind": "k1", "kl_coef": 0.001, "kl_target": None}})


def build(cfg) -> Graph:
    a = cfg.algorithm
    g = Graph("ppo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
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

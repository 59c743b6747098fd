"""REINFORCE++: token rewards with a KL penalty, discounted returns whitened over the
batch; `algorithm.baseline=true` subtracts each prompt's mean score instead."""
from hybridflow import Graph

from graphs import ops
from graphs.common import embedded_defaults


def defaults() -> dict:
    return embedded_defaults(**{"rollout": {"n": 8},
            "algorithm": {"baseline": False, "gamma": 1.0, "kl_kind": "k2", "kl_coef": 0.001}})


def build(cfg) -> Graph:
    a = cfg.algorithm
    g = Graph("reinforce_pp")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    if a.baseline:
        adv = g.fn(ops.reinforce_pp_baseline_advantages, rollout, score)
    else:
        rewards = g.fn(ops.kl_in_reward(a.kl_kind, a.kl_coef), rollout, score, old, ref)
        adv = g.fn(ops.reinforce_pp_advantages, rollout, rewards, gamma=a.gamma)
    g.call("actor.update", rollout, old, ref, adv, loss=ops.policy_loss(cfg.actor))
    return g

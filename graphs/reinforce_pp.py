"""REINFORCE++: token rewards with a KL penalty, discounted returns whitened over the
batch; `algorithm.baseline=true` subtracts each prompt's mean score instead."""
from dataclasses import dataclass

from hybridflow.algorithms.kl import KL_KINDS
from hybridflow import Graph, at_least, checked, one_of, probability

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class ReinforcePPOptions:
    """The `algorithm` section of this graph."""
    baseline: bool = False                    # true: subtract each prompt's mean score
    gamma: float = checked(1.0, probability)  # discount of the token rewards
    kl_kind: str = checked("k2", one_of(*KL_KINDS, what="KL kind"))
    kl_coef: float = checked(0.001, at_least(0))  # the KL penalty's beta in the reward


ALGORITHM = ReinforcePPOptions


def defaults() -> dict:
    return embedded_defaults(rollout={"n": 8})


def build(cfg) -> Graph:
    a = cfg.algorithm
    g = Graph("reinforce_pp")
    prompts = g.source("prompts")
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
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

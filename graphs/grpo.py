"""GRPO: sample n responses per prompt, score them, and use each prompt's group of
scores as the baseline. No critic. `algorithm.norm_by_std=false` gives Dr.GRPO;
`actor.use_kl_loss=false` drops the reference policy from the graph altogether."""
from dataclasses import dataclass

from hybridflow import Graph

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class GRPOOptions:
    """The `algorithm` section of this graph."""
    norm_by_std: bool = True  # divide by each group's std; false gives Dr.GRPO


ALGORITHM = GRPOOptions


def defaults() -> dict:
    return embedded_defaults(rollout={"n": 8},
                             actor={"use_kl_loss": True, "kl_loss_coef": 0.001})


def build(cfg) -> Graph:
    g = Graph("grpo")
    prompts = g.source("prompts")
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(ops.grpo_advantages, rollout, score, norm_by_std=cfg.algorithm.norm_by_std)
    inputs = [rollout, old, adv]
    if cfg.actor.use_kl_loss:  # the KL loss needs the reference policy
        inputs.append(g.call("ref.logprob", rollout))
    g.call("actor.update", *inputs, loss=ops.policy_loss(cfg.actor))
    return g

"""RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
from dataclasses import dataclass

from hybridflow import Graph

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class RLOOOptions:
    """The `algorithm` section of this graph: it has no knobs, so any key is a typo."""


ALGORITHM = RLOOOptions


def defaults() -> dict:
    return embedded_defaults(rollout={"n": 8})


def build(cfg) -> Graph:
    g = Graph("rloo")
    prompts = g.source("prompts")
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(ops.rloo_advantages, rollout, score)
    inputs = [rollout, old, adv]
    if cfg.actor.use_kl_loss:  # the KL loss needs the reference policy
        inputs.append(g.call("ref.logprob", rollout))
    g.call("actor.update", *inputs, loss=ops.policy_loss(cfg.actor))
    return g

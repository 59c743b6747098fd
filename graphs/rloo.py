"""RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
from hybridflow import Graph

from graphs import ops
from graphs.common import embedded_defaults


def defaults() -> dict:
    return embedded_defaults(**{"rollout": {"n": 8}})


def build(cfg) -> Graph:
    g = Graph("rloo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(ops.rloo_advantages, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g

"""GRPO: sample n responses per prompt, score them, and use each prompt's group of
scores as the baseline. No critic. `algorithm.norm_by_std=false` gives Dr.GRPO."""
from hybridflow import Graph

from graphs import ops
from graphs.common import embedded_defaults


def defaults() -> dict:
    return embedded_defaults(**{"rollout": {"n": 8}, "algorithm": {"norm_by_std": True}})


def build(cfg) -> Graph:
    g = Graph("grpo")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(ops.grpo_advantages, rollout, score, norm_by_std=cfg.algorithm.norm_by_std)
    g.call("actor.update", rollout, old, ref, adv)
    return g

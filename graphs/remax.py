"""ReMax: the baseline of each sampled response is the score of the greedy response
to the same prompt, produced by a second, greedy generate node."""
from dataclasses import dataclass

from hybridflow import Graph

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class ReMaxOptions:
    """The `algorithm` section of this graph: it has no knobs, so any key is a typo."""


ALGORITHM = ReMaxOptions


def defaults() -> dict:
    return embedded_defaults(rollout={"n": 4})


def build(cfg) -> Graph:
    g = Graph("remax")
    prompts = g.source("prompts")
    # the greedy baseline first: where two nodes report one metric (critic/score/mean,
    # response_length/mean), the later node's value is logged, and that should be the samples'
    greedy = g.call("rollout.generate", prompts, n=1, do_sample=False, name="greedy")
    baseline = g.call("reward.score", greedy, name="baseline",
                      rename={"scores": "baseline_scores",
                              "token_level_scores": "baseline_token_scores"})
    baseline = g.fn(ops.repeat_baseline, baseline, n=cfg.rollout.n)  # one per sample
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    score = g.call("reward.score", rollout)
    rewards = g.fn(ops.scores_to_rewards, score)
    adv = g.fn(ops.remax_advantages, rollout, rewards, baseline)
    inputs = [rollout, old, adv]
    if cfg.actor.use_kl_loss:  # the KL loss needs the reference policy
        inputs.append(g.call("ref.logprob", rollout))
    g.call("actor.update", *inputs, loss=ops.policy_loss(cfg.actor))
    return g

"""DAPO: GRPO plus dynamic sampling (drop groups whose samples all score the same and
draw more prompts until the batch is full, at most `algorithm.max_rounds` extra
times), clip-higher, token-mean loss and a soft overlong penalty."""
from dataclasses import dataclass

from hybridflow import Graph, at_least, checked

from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


@dataclass
class DAPOOptions:
    """The `algorithm` section of this graph."""
    max_rounds: int = checked(3, at_least(0))        # extra draws to fill the batch
    overlong_buffer: int = checked(1, at_least(0))   # tokens before the length limit
    overlong_factor: float = checked(1.0, at_least(0))  # the most an overlong reply loses


ALGORITHM = DAPOOptions


def defaults() -> dict:
    return embedded_defaults(
        rollout={"n": 8},
        actor={"clip_low": 0.2, "clip_high": 0.28, "loss_agg_mode": "token-mean"})


def build(cfg) -> Graph:
    a = cfg.algorithm
    g = Graph("dapo")
    prompts = g.source("prompts")
    rollout = g.call("rollout.generate", prompts, n=cfg.rollout.n)
    raw = g.call("reward.score", rollout)
    score = g.fn(ops.overlong_penalty, rollout, raw, max_length=cfg.rollout.max_new_tokens,
                 buffer=a.overlong_buffer, factor=a.overlong_factor)
    kept = g.fn(ops.drop_uniform_groups, rollout, score)
    batch = g.gather(kept, until=cfg.data.batch_size * cfg.rollout.n, max_rounds=a.max_rounds)
    old = g.call("actor.logprob", batch)
    adv = g.fn(ops.grpo_advantages, batch)
    inputs = [batch, old, adv]
    if cfg.actor.use_kl_loss:  # the KL loss needs the reference policy
        inputs.append(g.call("ref.logprob", batch))
    g.call("actor.update", *inputs, loss=ops.policy_loss(cfg.actor))
    return g

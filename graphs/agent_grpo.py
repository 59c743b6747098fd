"""GRPO over agent episodes: the policy plays the calculator task with its tool
(`agent.play`: generate, call the environment, append its observation, generate
again), the environment's reward scores each episode, each prompt's group of
episodes is the baseline. No critic, no reward model.

Training counts only the model's own tokens: the batch's `loss_mask` (observation
and tool-result tokens 0) is the mask of the advantages, the loss and the KL
(`graphs/ops.py`). It starts from graphs/assets/agent_base (made by
graphs/agent_sft.py), which calls the tool on some problems and answers alone on
the others; RL makes the call the habit. Validation plays one greedy episode per
held-out problem (`val/toy_calc/greedy`).
"""
from dataclasses import dataclass

from hybridflow import Graph

from hybridflow.graphs import ops
from hybridflow.graphs.common_agent import AGENT_BASE, agent_task_defaults, agent_validation


@dataclass
class AgentGRPOOptions:
    """The `algorithm` section of this graph."""
    norm_by_std: bool = True  # divide by each group's std; false gives Dr.GRPO


ALGORITHM = AgentGRPOOptions


def defaults() -> dict:
    return agent_task_defaults(model={"path": AGENT_BASE, "tokenizer": "auto"},
                               trainer={"steps": 40, "val_every": 10},
                               rollout={"n": 8},
                               actor={"lr": 1e-3, "use_kl_loss": False})


def build(cfg) -> Graph:
    g = Graph("agent_grpo")
    episodes = g.call("agent.play", g.source("prompts"), n=cfg.rollout.n)
    old = g.call("actor.logprob", episodes)
    adv = g.fn(ops.grpo_advantages, episodes, norm_by_std=cfg.algorithm.norm_by_std)
    inputs = [episodes, old, adv]
    if cfg.actor.use_kl_loss:  # the KL loss needs the reference policy
        inputs.append(g.call("ref.logprob", episodes))
    g.call("actor.update", *inputs, loss=ops.policy_loss(cfg.actor))
    return g


validation = agent_validation

"""Supervised fine-tuning on tool-calling demonstrations: makes the calculator task's
base checkpoint (graphs/assets/agent_base) for `graphs/agent_grpo.py`.

    hybridflow run graphs/agent_sft.py trainer.run_name=agent_base trainer.seed=1
    hybridflow export runs/agent_base graphs/assets/agent_base

Each demonstration is tokenised through the agent code
(`graphs/envs/calculator_sft.py`), so the model learns on exactly the token
layout the agent rollout samples. `algorithm.call_probability` is the share of
demonstrations that call the tool and copy its result; the others answer alone
(a guess, right half of the time). Too many calls and the base is already good
(0.5: 0.83 greedy accuracy); too few and greedy decoding never calls (0.35: 0.0).
The shipped base (0.4, these defaults, seed 1: 0.455) sits in between: it calls on
some problems and copies the result exactly, so RL has a tool habit to reinforce
(graphs/assets/agent_base/README.md).
"""
from dataclasses import dataclass

from hybridflow import Graph, checked, probability

from hybridflow.graphs.envs.calculator_sft import ToolSFTExamples
from hybridflow.graphs import ops
from hybridflow.graphs.common_agent import agent_task_defaults, agent_validation


@dataclass
class AgentSFTOptions:
    """The `algorithm` section of this graph."""
    call_probability: float = checked(0.4, probability)  # demonstrations calling the tool
    malformed_probability: float = checked(0.1, probability)  # calls missing their ")"


ALGORITHM = AgentSFTOptions


def defaults() -> dict:
    out = agent_task_defaults(trainer={"steps": 400, "val_every": 100},
                              data={"batch_size": 32},
                              actor={"lr": 3e-3, "mini_batch_size": 32, "micro_batch_size": 32},
                              rollout={"n": 1})
    out.pop("model", None)  # SFT starts from random weights (the model section's config)
    return out


def build(cfg) -> Graph:
    from hybridflow import tokenizer_spec
    g = Graph("agent_sft")
    make = ToolSFTExamples(tokenizer_spec(cfg.model), cfg.algorithm.call_probability,
                           cfg.algorithm.malformed_probability, cfg.trainer.seed)
    g.call("actor.sft", g.fn(make, g.source("prompts")), loss=ops.sft_loss)
    return g


validation = agent_validation

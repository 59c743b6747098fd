"""What the agent graphs (`agent_sft.py`, `agent_grpo.py`) share: the calculator task's
config (its data, environment and episode budget) and the validation graph that
measures held-out greedy accuracy by playing episodes with the tool.

The task's data ships beside the base checkpoint, in graphs/assets/agent_base/data
(`python -m hybridflow.graphs.envs.calculator_sft graphs/assets/agent_base/data --train 2000
--test 200` remakes it).
"""
from __future__ import annotations

import os

from hybridflow import Batch, Graph, node_fn

from hybridflow.graphs.common import embedded_defaults, merge

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
AGENT_BASE = os.path.join(ASSETS, "agent_base")
AGENT_DATA = os.path.join(AGENT_BASE, "data")
CALCULATOR_ENV = "hybridflow.graphs.envs.calculator:make_env"  # importable wherever hybridflow is


def agent_task_defaults(**overrides) -> dict:
    """The calculator task on the CPU: its data, the `agent` role bound to the actor's
    engine, and an episode budget that fits a call, its result and the answer."""
    out = embedded_defaults(
        data={"train_files": os.path.join(AGENT_DATA, "train.jsonl"),
              "val_files": os.path.join(AGENT_DATA, "test.jsonl"),
              "max_prompt_length": 16},
        workers={"agent": "hybridflow.agents.worker:AgentRolloutWorker"},
        agent={"env": CALCULATOR_ENV, "max_turns": 2, "max_turn_tokens": 24,
               "max_response_tokens": 64},
        trainer={"val_samples": 1})
    return merge(out, overrides)


def agent_validation(cfg) -> Graph:
    """Held-out greedy accuracy with the tool: one greedy episode per prompt, scored by
    the environment (`val/toy_calc/greedy`, read from the episode's `scores`)."""
    g = Graph("agent_validation")
    greedy = g.call("agent.play", g.source("prompts"), n=1, do_sample=False, name="greedy")
    g.fn(episode_scores, greedy, name="greedy_score", validation="greedy")  # the loop reads it
    # the agent role lives in the actor's process, so the plan must hold the actor: its
    # log-probs of the greedy episodes are a cheap way to (and report the entropy)
    g.call("actor.logprob", greedy, with_entropy=True)
    return g


@node_fn(reads=("scores",), writes=("scores",), overwrites=("scores",), rows=True)
def episode_scores(batch: Batch) -> Batch:
    """The environment's episode rewards, as the validation loop's `scores`."""
    return Batch({"scores": batch["scores"].float()})

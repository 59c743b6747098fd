"""Planner inputs for tests: a tiny graph type with the ExecutionPlan's node attributes."""
from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.planner import Cluster, ModelSpec, Workload


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    role: str | None
    deps: tuple[str, ...] = ()


@dataclass
class TinyGraph:
    nodes: list[Node] = field(default_factory=list)


def ppo_graph(extra_scores: tuple[str, ...] = ()) -> TinyGraph:
    """prompts -> actor.generate -> {actor, ref, critic, reward (+extra)} -> advantages
    -> updates."""
    scorers = ["actor.logprob", "ref.logprob", "critic.values", "reward.score"]
    scorers += [f"{role}.score" for role in extra_scores]
    nodes = [Node("prompts", "source", None),
             Node("actor.generate", "generate", "actor", ("prompts",))]
    nodes += [Node(name, "inference", name.split(".")[0], ("actor.generate",)) for name in scorers]
    nodes += [Node("advantages", "function", None, tuple(scorers)),
              Node("critic.update", "train", "critic", ("advantages",)),
              Node("actor.update", "train", "actor", ("advantages",))]
    return TinyGraph(nodes)


def grpo_graph() -> TinyGraph:
    """No critic: actor, ref and a rule reward."""
    return TinyGraph([
        Node("prompts", "source", None),
        Node("actor.generate", "generate", "actor", ("prompts",)),
        Node("actor.logprob", "inference", "actor", ("actor.generate",)),
        Node("ref.logprob", "inference", "ref", ("actor.generate",)),
        Node("reward.score", "inference", "reward", ("actor.generate",)),
        Node("advantages", "function", None, ("reward.score",)),
        Node("actor.update", "train", "actor", ("actor.logprob", "ref.logprob", "advantages")),
    ])


def same_size(size: str, roles=("actor", "ref", "critic")) -> dict[str, ModelSpec]:
    spec = ModelSpec.from_name(size)
    return {role: spec for role in roles}


PAPER_WORKLOAD = Workload(prompts=1024, samples_per_prompt=1, prompt_len=1024, response_len=1024,
                          mini_batches=8)  # the HybridFlow paper's 8 mini-batches
SMALL_WORKLOAD = Workload(prompts=64, samples_per_prompt=4, prompt_len=256, response_len=512)


def a100(devices: int, per_node: int = 8) -> Cluster:
    return Cluster(nodes=max(1, devices // per_node), gpus_per_node=min(devices, per_node),
                   device="a100-80g")

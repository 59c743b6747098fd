"""What the planner plans for: the graph's roles and nodes, the workload, the models.

The planner reads only a minimal view of a graph: `graph.nodes`, a list in
topological order of objects with `name`, `kind` (source, generate, inference,
train, function), `role` (None for source and function nodes) and `deps`
(names of upstream nodes). The compiled ExecutionPlan has exactly this shape,
and tests can build it from a tiny dataclass.
"""
from __future__ import annotations

from dataclasses import dataclass

from .devices import Cluster
from .models import ModelSpec

NODE_KINDS = ("source", "generate", "inference", "train", "function")
DEVICE_KINDS = ("generate", "inference", "train")  # kinds a role runs on its pool


class PlanningError(ValueError):
    """The inputs cannot be planned; the message says what to change."""


@dataclass(frozen=True)
class Workload:
    """One training step's work.

    `mini_batches` optimizer steps per PPO epoch (verl's train batch /
    ppo_mini_batch_size) and `micro_batch_tokens` tokens per device per forward
    (verl's ppo_max_token_len_per_gpu with dynamic batching) shape the
    communication of the trained roles and their activation memory.
    """

    prompts: int
    samples_per_prompt: int
    prompt_len: int
    response_len: int
    ppo_epochs: int = 1
    mini_batches: int = 4
    micro_batch_tokens: int = 8192

    def __post_init__(self) -> None:
        for field in ("prompts", "samples_per_prompt", "prompt_len", "response_len",
                      "ppo_epochs", "mini_batches", "micro_batch_tokens"):
            if getattr(self, field) < 1:
                raise PlanningError(f"workload {field} must be at least 1, "
                                    f"got {getattr(self, field)}")

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len

    def describe(self) -> str:
        return (f"{self.prompts} prompts x {self.samples_per_prompt} sample(s), "
                f"{self.prompt_len}+{self.response_len} tokens, {self.ppo_epochs} epoch(s) "
                f"of {self.mini_batches} mini-batch(es)")


@dataclass(frozen=True)
class NodeInfo:
    """The planner's copy of one graph node."""

    name: str
    kind: str
    role: str | None
    deps: tuple[str, ...]


@dataclass(frozen=True)
class Problem:
    """Validated planner input. `placed_roles` need devices; other roles run on the driver."""

    nodes: tuple[NodeInfo, ...]
    cluster: Cluster
    models: dict[str, ModelSpec]
    workload: Workload
    placed_roles: tuple[str, ...]
    driver_roles: tuple[str, ...]

    def role_nodes(self, role: str) -> list[NodeInfo]:
        return [n for n in self.nodes if n.role == role]

    def trains(self, role: str) -> bool:
        return any(n.kind == "train" for n in self.role_nodes(role))

    def generates(self, role: str) -> bool:
        return any(n.kind == "generate" for n in self.role_nodes(role))


def read_nodes(graph) -> tuple[NodeInfo, ...]:
    nodes = getattr(graph, "nodes", None)
    if nodes is None:
        raise PlanningError("the planner needs a graph with a `.nodes` list "
                            "(a compiled ExecutionPlan)")
    seen: set[str] = set()
    out = []
    for node in nodes:
        info = NodeInfo(node.name, node.kind, node.role, tuple(node.deps))
        if info.kind not in NODE_KINDS:
            raise PlanningError(f"node {info.name!r} has kind {info.kind!r}; "
                                f"expected one of {NODE_KINDS}")
        if info.kind in DEVICE_KINDS and not info.role:
            raise PlanningError(f"node {info.name!r} of kind {info.kind!r} has no role")
        missing = [d for d in info.deps if d not in seen]
        if missing:
            raise PlanningError(f"node {info.name!r} depends on {missing}, "
                                "which do not come before it; "
                                "the planner needs nodes in topological order")
        seen.add(info.name)
        out.append(info)
    return tuple(out)


def build_problem(graph, cluster: Cluster, models: dict[str, ModelSpec],
                  workload: Workload) -> Problem:
    nodes = read_nodes(graph)
    roles = list(dict.fromkeys(n.role for n in nodes if n.role))
    unknown = sorted(set(models) - set(roles))
    if unknown:
        raise PlanningError(f"model sizes given for roles not in the graph: {unknown}; "
                            f"graph roles: {roles}")
    placed, driver = [], []
    for role in roles:
        kinds = {n.kind for n in nodes if n.role == role}
        if role in models:
            placed.append(role)
        elif kinds & {"train", "generate"}:
            raise PlanningError(f"role {role!r} runs {sorted(kinds)} and needs a model size "
                                f"(e.g. --model {role}=7b)")
        else:
            driver.append(role)  # a rule function, e.g. a rule-based reward
    if not placed:
        raise PlanningError("no role has a model size, so there is nothing to place on devices")
    return Problem(nodes, cluster, dict(models), workload, tuple(placed), tuple(driver))

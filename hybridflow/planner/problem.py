"""What the planner plans for: the graph's roles and nodes, the workload, the models.

The planner reads only a minimal view of a graph: `graph.nodes`, a list in
topological order of objects with `name`, `kind` (source, generate, inference,
train, function), `role` (None for source and function nodes) and `deps`
(names of upstream nodes). The compiled ExecutionPlan has exactly this shape,
and tests can build it from a tiny dataclass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.core.kinds import METHOD_KINDS, NodeKind
from hybridflow.core.modes import AsyncMode

from .devices import Cluster
from .models import ModelSpec

# a graph's kinds: the planner drops buffers and makes the weight-sync nodes itself
NODE_KINDS = tuple(k for k in NodeKind if k not in (NodeKind.BUFFER, NodeKind.SYNC))
DEVICE_KINDS = METHOD_KINDS  # kinds a role runs on its pool
SYNC_KIND = NodeKind.SYNC  # planner-made weight-sync nodes of a rollout placed apart (pipeline.py)


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
    mini_batches: int = 8
    micro_batch_tokens: int = 8192
    response_mean: float = 0.0  # mean response tokens; 0: every response is response_len long
    response_sigma: float = 0.6  # lognormal shape of response lengths (when response_mean > 0)
    padded_len: int = 0  # 0: passes pack each sequence's own tokens; N: every sequence padded to N
    # sequences per call to a rollout replica; 0: all of its share in one call (continuous
    # batching over the whole batch). N: the engine gets N at a time, call after call, as
    # systems that make experience micro-batch by micro-batch do (OpenRLHF 2024).
    rollout_call_sequences: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts", "samples_per_prompt", "prompt_len", "response_len",
                     "ppo_epochs", "mini_batches", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise PlanningError(f"workload {name} must be at least 1, "
                                    f"got {getattr(self, name)}")
        if not 0 <= self.response_mean <= self.response_len:
            raise PlanningError(f"workload response_mean {self.response_mean} must lie in "
                                f"[0, response_len={self.response_len}] (0: all at the max)")
        if self.rollout_call_sequences < 0:
            raise PlanningError(f"workload rollout_call_sequences must be >= 0 (0: one call), "
                                f"got {self.rollout_call_sequences}")
        if self.response_sigma < 0:
            raise PlanningError(f"workload response_sigma must be >= 0, got {self.response_sigma}")

    @property
    def mean_response_len(self) -> float:
        return self.response_mean or float(self.response_len)

    @property
    def mean_seq_len(self) -> float:
        """Mean tokens of one sequence: what packed (dynamic-batch) passes process."""
        return self.prompt_len + self.mean_response_len

    @property
    def pass_seq_len(self) -> float:
        """Tokens one sequence costs a train or forward pass: its own, or the padded length."""
        return float(self.padded_len) if self.padded_len else self.mean_seq_len

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
        response = (f"{self.response_len}" if not self.response_mean else
                    f"{self.response_mean:.0f} (max {self.response_len})")
        calls = (f", rollout fed {self.rollout_call_sequences} sequences a call"
                 if self.rollout_call_sequences else "")
        return (f"{self.prompts} prompts x {self.samples_per_prompt} sample(s), "
                f"{self.prompt_len}+{response} tokens, {self.ppo_epochs} epoch(s) "
                f"of {self.mini_batches} mini-batch(es){calls}")


TRAIN_BACKENDS = ("fsdp", "megatron")  # sharded over the pool; model parallel
OFFLOAD_MODES = ("none", "optimizer", "all")


@dataclass(frozen=True)
class TrainingBackend:
    """How trained and scored roles run their passes.

    `fsdp`: ZeRO-3 over the whole pool, weights re-gathered every micro-batch.
    `megatron`: tp x pp model parallel (tp inside a node), data parallel over
    the rest, weights never re-gathered; gradients all-reduced once per
    optimizer step. `offload` moves Adam states and fp32 master weights
    ("optimizer"), or also the bf16 parameters ("all"), to host memory.
    """

    kind: str = "fsdp"
    tp: int = 1
    pp: int = 1
    offload: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in TRAIN_BACKENDS:
            raise PlanningError(f"training backend {self.kind!r} is not one of {TRAIN_BACKENDS}")
        if self.offload not in OFFLOAD_MODES:
            raise PlanningError(f"offload {self.offload!r} is not one of {OFFLOAD_MODES}")
        if self.tp < 1 or self.pp < 1:
            raise PlanningError(f"training tp and pp must be at least 1, got {self.tp}, {self.pp}")
        if not self.model_parallel and (self.tp, self.pp) != (1, 1):
            raise PlanningError("training tp/pp need the megatron backend (--train-backend "
                                "megatron); fsdp shards over the whole pool")

    @property
    def model_parallel(self) -> bool:
        """Splits the model tp x pp (megatron) rather than sharding it over the pool."""
        return self.kind == TRAIN_BACKENDS[1]

    def describe(self) -> str:
        parallel = f" tp{self.tp} pp{self.pp}" if self.model_parallel else ""
        offload = f", offload {self.offload}" if self.offload != "none" else ""
        return f"{self.kind}{parallel}{offload}"


@dataclass(frozen=True)
class NodeInfo:
    """The planner's copy of one graph node; a kind given as its string converts."""

    name: str
    kind: NodeKind
    role: str | None
    deps: tuple[str, ...]

    def __post_init__(self) -> None:
        try:
            kind = NodeKind(self.kind)
        except ValueError:
            raise PlanningError(f"node {self.name!r} has kind {self.kind!r}; expected one "
                                f"of {', '.join(NODE_KINDS)}") from None
        object.__setattr__(self, "kind", kind)


@dataclass(frozen=True)
class Pipeline:
    """`trainer.staleness >= 1` as the planner sees it: rollout and training overlap.

    `rollout_side` names the nodes that run ahead of training (the compiler's
    `async_split.split_sides(plan, k).rollout`); every other node is on the train
    side. `movable` maps a generate node that may run on a pool of its own, with
    weights of its own synced after each update, to the role that then runs it
    (e.g. "rollout.generate" -> "rollout"); in the graph the planner gets, such a
    node belongs to the role whose weights it samples with (its host).
    `streaming` (`trainer.async_mode=streaming`): the rollout side is the stream side
    (sources and the one generate node) and steps have no barrier (streaming.py).
    """

    staleness: int
    rollout_side: frozenset[str]
    movable: dict[str, str] = field(default_factory=dict, hash=False)
    streaming: bool = False

    def __post_init__(self) -> None:
        if self.staleness < 1:
            raise PlanningError(f"a pipelined step needs staleness >= 1, got {self.staleness}; "
                                "plan a synchronous step without a Pipeline")

    @property
    def mode(self) -> AsyncMode:
        return AsyncMode.STREAMING if self.streaming else AsyncMode.PIPELINE

    def describe(self) -> str:
        if self.streaming:
            return (f"async streaming, staleness {self.staleness}: the rollout generates "
                    "continuously and a step trains once its batch is in, no barrier")
        return (f"async, staleness {self.staleness}: the rollout side of step t+{self.staleness} "
                "runs while step t trains")


@dataclass(frozen=True)
class Problem:
    """Validated planner input. `placed_roles` need devices; other roles run on the driver."""

    nodes: tuple[NodeInfo, ...]
    cluster: Cluster
    models: dict[str, ModelSpec]
    workload: Workload
    placed_roles: tuple[str, ...]
    driver_roles: tuple[str, ...]
    backend: TrainingBackend = TrainingBackend()
    rollout_tp: int = 0  # 0: the search picks each generating role's tp; N: only tp N
    pipeline: Pipeline | None = None  # None: synchronous steps (trainer.staleness=0)
    # generating roles placed apart from the role whose weights they sample with
    # (role -> host): they hold their own copy, synced after each update (pipeline.py)
    own_weights: dict[str, str] = field(default_factory=dict, hash=False)
    # whether the run can split a role's rows over sp ranks (cost.sp_options weighs it
    # only where a row does not fit at sp=1)
    sequence_parallel: bool = True

    def role_nodes(self, role: str) -> list[NodeInfo]:
        return [n for n in self.nodes if n.role == role]

    def trains(self, role: str) -> bool:
        return any(n.kind.trains for n in self.role_nodes(role))

    def generates(self, role: str) -> bool:
        return any(n.kind.generates for n in self.role_nodes(role))


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
            raise PlanningError(f"node {info.name!r} has kind {str(info.kind)!r}; "
                                f"expected one of {', '.join(NODE_KINDS)}")
        if info.kind in DEVICE_KINDS and not info.role:
            raise PlanningError(f"node {info.name!r} of kind {str(info.kind)!r} has no role")
        missing = [d for d in info.deps if d not in seen]
        if missing:
            raise PlanningError(f"node {info.name!r} depends on {missing}, "
                                "which do not come before it; "
                                "the planner needs nodes in topological order")
        seen.add(info.name)
        out.append(info)
    return tuple(out)


def build_problem(graph, cluster: Cluster, models: dict[str, ModelSpec],
                  workload: Workload, backend: TrainingBackend | None = None,
                  rollout_tp: int = 0, pipeline: Pipeline | None = None,
                  sequence_parallel: bool = True) -> Problem:
    nodes = read_nodes(graph)
    if pipeline is not None:
        check_pipeline(nodes, pipeline)
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
        elif kinds & {NodeKind.TRAIN, NodeKind.GENERATE}:
            raise PlanningError(f"role {role!r} runs {sorted(map(str, kinds))} and needs a "
                                f"model size (e.g. --model {role}=7b)")
        else:
            driver.append(role)  # a rule function, e.g. a rule-based reward
    if not placed:
        raise PlanningError("no role has a model size, so there is nothing to place on devices")
    return Problem(nodes, cluster, dict(models), workload, tuple(placed), tuple(driver),
                   backend or TrainingBackend(), rollout_tp, pipeline,
                   sequence_parallel=sequence_parallel)


def check_pipeline(nodes: tuple[NodeInfo, ...], pipeline: Pipeline) -> None:
    by_name = {n.name: n for n in nodes}
    unknown = sorted((set(pipeline.rollout_side) | set(pipeline.movable)) - set(by_name))
    if unknown:
        raise PlanningError(f"the pipeline names nodes the graph does not have: {unknown}")
    for name, role in pipeline.movable.items():
        node = by_name[name]
        if not node.kind.generates or name not in pipeline.rollout_side:
            raise PlanningError(f"node {name!r} ({node.kind}) cannot run apart as role "
                                f"{role!r}: only a rollout-side generate node can")
        if role in {n.role for n in nodes}:
            raise PlanningError(f"node {name!r} would run apart as role {role!r}, which the "
                                "graph already has; fold it into its host first")

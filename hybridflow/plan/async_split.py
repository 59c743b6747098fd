"""Async training from the same graph: the rollout side, the train side, and the
BUFFER nodes between them.

With `trainer.staleness = k >= 1` the rollout runs up to k steps ahead of training.
The compiler derives the two sides from the graph (`split_sides`):

- the **rollout side**: the data sources, the generate node(s), and every node that
  depends only on them and does not read a trained role's current weights (rule
  rewards, a reward model, reference log-probs, group advantages, a gather);
- the **train side**: everything else (`actor.logprob`, `critic.values`, updates, the
  weight-sync edge).

Where the split is impossible (a generate node fed by the train side; a gather that
re-runs training) `split_sides` raises a `GraphError` naming the node. An update of
the generating policy trained on ahead-of-time samples must correct for them (its
loss reads `rollout_log_probs`) unless the user opts out: `correction_problems`.

`attach_staleness` then gives ONE plan: every edge from a rollout-side node to the
train side goes through a `BUFFER` node (`buffer/<producer>`, a `BufferSpec`: its
capacity k, the group key it admits whole, and its admission rule on the rows'
`policy_version`). The run-long scheduler (runtime/run_long/run_scheduler.py) keeps the
buffers' contents across steps. A train-side node that changes the weights the
rollout samples with (the colocated update of the generating host, or the weight
sync into a rollout's own copy) lists the samplers in `PlanNode.after`: when both
run in one scheduler pass, it waits for the generation, so a batch is sampled with
the weights from before that pass's update on both runtimes. `trainer.staleness=0`
inserts no buffer: the plan is the graph's (a buffer of capacity 0 passes through).

`sides_of(plan)` reads the sides back from a plan's buffers (for drawings and the
planner); `without_buffers(plan)` is the graph's plan without them.
Stateless: functions of a plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.core.columns import ROLLOUT_LOG_PROBS
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.core.modes import AsyncMode
from hybridflow.plan.compiler import (SUMMARY_SECTIONS, ExecutionPlan, GraphError, PlanNode,
                                      plan_stages)
from hybridflow.plan.weight_sync import LOAD_METHOD, weights_host

__all__ = ["Sides", "BufferSpec", "split_sides", "staleness_of", "correction_problems",
           "attach_staleness", "insert_buffers", "check_buffers", "sides_of",
           "without_buffers", "buffer_summary", "buffer_nodes", "BUFFER_PREFIX",
           "CORRECTION_KEY", "PROMPT_UNIT"]

BUFFER_PREFIX = "buffer/"             # a buffer node is named after its producer
CORRECTION_KEY = ROLLOUT_LOG_PROBS    # a loss reading it corrects for the behaviour policy
PROMPT_UNIT = "uid"                   # a prompt's samples: what the loader draws together


@dataclass(frozen=True)
class BufferSpec:
    """What a BUFFER node holds and admits."""
    producer: str          # the rollout-side node whose outputs it holds
    capacity: int          # batches generated ahead and not yet trained (k)
    unit: str | None       # group key admitted whole (a GRPO group: `uid`)
    max_staleness: int     # admits rows with policy_version >= trained version - this
    # STREAMING: fed sample by sample as they finish (streaming_split.py)
    mode: AsyncMode = AsyncMode.PIPELINE
    screened_by: str | None = None  # streaming: the filter whole groups pass to enter

    @property
    def streaming(self) -> bool:
        return self.mode.streams

    def describe(self) -> str:
        unit = f"unit {self.unit}" if self.unit else "unit: the batch"
        fed = "; streams samples as they finish" if self.streaming else ""
        if self.screened_by:
            fed += f", each whole group screened at the entrance by '{self.screened_by}'"
        return (f"capacity {self.capacity}, {unit}, admits policy_version >= "
                f"trained - {self.max_staleness}{fed}")


@dataclass(frozen=True)
class Sides:
    """The split of a plan's nodes (names in plan order)."""
    rollout: tuple[str, ...]
    train: tuple[str, ...]
    handoff: tuple[str, ...]           # rollout nodes the train side reads
    staleness: int

    def crossing_edges(self, plan: ExecutionPlan) -> list[tuple[str, str]]:
        """(rollout node, train node) edges: where the samples wait up to k steps
        (through the buffer of the rollout node, in a buffered plan)."""
        rollout = set(self.rollout)
        return [(_producer(plan, d), n) for n in self.train for d in plan.node(n).deps
                if d in rollout or _producer(plan, d) in rollout]


def _producer(plan: ExecutionPlan, name: str) -> str:
    node = plan.node(name)
    return node.buffer.producer if node.op is Op.BUFFER else name


def trained_roles(plan: ExecutionPlan) -> set[str]:
    return {n.role for n in plan.nodes if n.kind.trains and n.role}


def _generator_host(plan: ExecutionPlan, node: PlanNode) -> str:
    """The role whose weights a generate node samples with: the host serving it
    (folded), the host it syncs from, or its own role."""
    folded = plan.placement.folded.get(node.role)
    if folded:
        return folded
    cls = plan.bindings.get(node.role)
    return (weights_host(cls) if cls is not None else None) or node.role


def _keeps_state(node: PlanNode) -> bool:
    """A function node with state across steps (checkpointed with the run) stays on
    the train side: it sees each batch once, in step order, when it is trained, so
    a resume that re-draws the buffered batches does not count them twice."""
    return node.op is Op.FN and callable(getattr(node.fn, "state_dict", None))


def split_sides(plan: ExecutionPlan, staleness: int) -> Sides:
    """The two sides of `plan`; GraphError naming the node when they cannot be split."""
    trained, rollout, problems = trained_roles(plan), set(), []
    for node in plan.nodes:
        ahead = all(d in rollout for d in node.deps)
        if node.kind.generates and not ahead:
            blocker = next(d for d in node.deps if d not in rollout)
            problems.append(f"{node.where()}: trainer.staleness={staleness} generates ahead "
                            f"of training, but this generate node reads '{blocker}', which "
                            f"needs the current weights of a trained role; feed it from the "
                            f"data and rollout-side nodes only, or set trainer.staleness=0")
        elif node.op is Op.GATHER and not ahead:
            problems.append(f"{node.where()}: this gather re-runs nodes of the train side, "
                            f"so it cannot run ahead of training (trainer.staleness="
                            f"{staleness}); gather before any node reading trained weights")
        elif ahead and not _keeps_state(node) and (
                node.op is not Op.CALL or node.role not in trained
                or node.kind.generates):  # e.g. `actor.generate`
            rollout.add(node.name)
    if not any(plan.node(n).kind.generates for n in rollout) and not problems:
        problems.append(f"trainer.staleness={staleness} runs the rollout ahead of training, "
                        f"but graph '{plan.graph_name}' has no generate node; set "
                        f"trainer.staleness=0")
    if problems:
        raise GraphError(plan.graph_name, problems)
    order = [n.name for n in plan.nodes]
    train = tuple(n for n in order if n not in rollout)
    handoff = tuple(n for n in order if n in rollout
                    and any(n in plan.node(t).deps for t in train))
    return Sides(tuple(n for n in order if n in rollout), train, handoff, staleness)


def correction_problems(plan: ExecutionPlan, sides: Sides,
                        default_corrects=lambda node: False) -> list[str]:
    """Updates of a generating policy that train on ahead-of-time samples without an
    off-policy correction: their loss does not read `rollout_log_probs`, and
    `default_corrects(node)` says the default loss the worker builds from config
    (a call without `loss=`) does not correct either."""
    hosts = {_generator_host(plan, plan.node(n)) for n in sides.rollout
             if plan.node(n).kind.generates}
    rollout, k, problems = set(sides.rollout), sides.staleness, []
    for name in sides.train:
        node = plan.node(name)
        if not (node.kind.trains and node.role in hosts) or CORRECTION_KEY in node.reads:
            continue
        if CORRECTION_KEY in node.optional and default_corrects(node):
            continue
        if any(w in rollout for w in node.input_keys.values()):
            problems.append(
                f"{node.where()}: trainer.staleness={k} trains '{node.role}' on samples "
                f"generated with weights up to {k} update(s) old, but its loss applies no "
                f"off-policy correction (it does not read '{CORRECTION_KEY}'); set "
                f"{node.role}.off_policy=tis or {node.role}.off_policy=decoupled (docs/"
                f"algorithms.md, 'Off-policy corrections'), pass a loss that reads "
                f"{CORRECTION_KEY}, or set trainer.allow_uncorrected_async=true to train "
                f"uncorrected")
    return problems


def attach_staleness(plan: ExecutionPlan, staleness: int, allow_uncorrected: bool = False,
                     default_corrects=lambda node: False) -> ExecutionPlan:
    """`plan` with its buffers when `staleness >= 1` (unchanged at 0); GraphError when
    the split is impossible or an update goes uncorrected without the opt-out."""
    if staleness < 1:
        return plan
    sides = split_sides(plan, staleness)
    problems = [] if allow_uncorrected else \
        correction_problems(plan, sides, default_corrects)
    if problems:
        raise GraphError(plan.graph_name, problems)
    return insert_buffers(plan, sides)


# ------------------------------------------------------------------ the buffers
def _unit(plan: ExecutionPlan, producer: PlanNode, train: list[PlanNode]) -> str | None:
    """The group key a buffer admits whole: the one its grouped consumers group by,
    else a prompt's samples (`uid`) when its rows carry them."""
    for node in train:
        if node.op is Op.FN and node.group_by and producer.name in node.deps:
            return node.group_by
    return PROMPT_UNIT if PROMPT_UNIT in producer.output_keys else None


def _buffer(plan: ExecutionPlan, producer: PlanNode, train: list[PlanNode],
            k: int) -> PlanNode:
    """Columns keep their writers' names (the rows carry them); only the dependency
    goes through the buffer."""
    spec = BufferSpec(producer.name, k, _unit(plan, producer, train), k)
    return PlanNode(BUFFER_PREFIX + producer.name, NodeKind.BUFFER, Op.BUFFER,
                    (producer.name,), f"{producer.location}; held up to {k} step(s)",
                    writes=producer.writes, input_keys=dict(producer.output_keys),
                    output_keys=dict(producer.output_keys), buffer=spec)


def _waits_for_generation(node: PlanNode, shared: set[str], own: set[str]) -> bool:
    """A train-side node that changes the weights the rollout side samples with: the
    update of a host whose module the generation shares (colocated), or the weight
    sync loading a rollout role's own copy."""
    if node.op is not Op.CALL:
        return False
    return (node.kind.trains and node.role in shared) or \
        (node.method == LOAD_METHOD and node.role in own)


def _samplers(plan: ExecutionPlan, ahead: list[PlanNode]) -> tuple[tuple, set, set]:
    """(rollout-side nodes sampling with the generating weights, hosts whose module
    the generation shares, generating roles with weights of their own)."""
    shared, own = set(), set()
    for node in ahead:
        if not node.kind.generates:
            continue
        host = _generator_host(plan, node)
        if node.role == host or plan.placement.folded.get(node.role) == host:
            shared.add(host)
        else:
            own.add(node.role)
    samplers = tuple(n.name for n in ahead if n.op is Op.GATHER
                     or (n.op is Op.CALL and (n.role in own or n.role in shared
                                              or plan.placement.folded.get(n.role) in shared)))
    return samplers, shared, own


def insert_buffers(plan: ExecutionPlan, sides: Sides) -> ExecutionPlan:
    """One plan: a BUFFER node after each rollout node the train side reads, the
    train side reading the buffers, weight changes ordered after the samplers."""
    rollout = set(sides.rollout)
    ahead = [n for n in plan.nodes if n.name in rollout]
    train = [n for n in plan.nodes if n.name not in rollout]
    samplers, shared, own = _samplers(plan, ahead)
    nodes = []
    for node in plan.nodes:
        if node.name in rollout:
            nodes.append(node)
            if node.name in sides.handoff:
                nodes.append(_buffer(plan, node, train, sides.staleness))
            continue
        deps = tuple(BUFFER_PREFIX + d if d in rollout else d for d in node.deps)
        after = samplers if _waits_for_generation(node, shared, own) else ()
        nodes.append(replace(node, deps=deps, after=after))
    out = replace(plan, nodes=nodes, stages=plan_stages(nodes))
    problems = check_buffers(out)
    if problems:
        raise GraphError(plan.graph_name, problems)
    return out


def buffer_nodes(plan: ExecutionPlan) -> list[PlanNode]:
    # the planner's own graphs (planner.Node: no op) have no buffers
    return [n for n in plan.nodes if getattr(n, "op", None) is Op.BUFFER]


def check_buffers(plan: ExecutionPlan) -> list[str]:
    """What the compiler refuses of a plan's buffers, one message per defect."""
    problems, buffers = [], buffer_nodes(plan)
    trained = trained_roles(plan)
    for node in buffers:
        spec = node.buffer
        if spec is None or node.deps != (spec.producer,):
            problems.append(f"{node.where()}: a buffer holds exactly one node's output; "
                            f"it has deps {list(node.deps)}")
            continue
        producer = plan.node(spec.producer)
        if producer.op is Op.CALL and producer.role in trained \
                and not producer.kind.generates:
            problems.append(f"{node.where()}: it buffers '{producer.name}', which reads "
                            f"the current weights of trained role '{producer.role}'; "
                            f"only rollout-side outputs can wait for training")
        if spec.capacity < 1 or spec.max_staleness < spec.capacity:
            problems.append(f"{node.where()}: capacity {spec.capacity} and admission "
                            f"bound {spec.max_staleness} must satisfy 1 <= capacity <= "
                            f"bound (capacity 0 is the synchronous plan: no buffer)")
        if spec.unit is not None and spec.unit not in producer.output_keys:
            problems.append(f"{node.where()}: its unit '{spec.unit}' is not a column of "
                            f"'{producer.name}' (it writes {sorted(producer.output_keys)})")
    if len({n.buffer.capacity for n in buffers if n.buffer}) > 1:
        problems.append("the buffers of one plan hold the same batches: give them one "
                        "capacity (trainer.staleness)")
    return problems


def staleness_of(plan: ExecutionPlan) -> int:
    """The buffers' capacity: 0 for a synchronous plan."""
    return max((n.buffer.capacity for n in buffer_nodes(plan)), default=0)


def sides_of(plan: ExecutionPlan) -> Sides | None:
    """The sides of a buffered plan (None without buffers): the train side is what
    reads a buffer, directly or not; the buffers belong to neither."""
    buffers = buffer_nodes(plan)
    if not buffers:
        return None
    names = {n.name for n in buffers}
    train: set[str] = set()
    for node in plan.nodes:
        if any(d in names or d in train for d in node.deps):
            train.add(node.name)
    order = [n.name for n in plan.nodes if n.name not in names]
    return Sides(tuple(n for n in order if n not in train), tuple(n for n in order if n in train),
                 tuple(n.buffer.producer for n in buffers), staleness_of(plan))


def without_buffers(plan: ExecutionPlan) -> ExecutionPlan:
    """The graph's plan: buffers removed, their readers reading the producers."""
    buffers = {n.name: n.buffer.producer for n in buffer_nodes(plan)}
    if not buffers:
        return plan
    nodes = [replace(n, deps=tuple(buffers.get(d, d) for d in n.deps), after=())
             for n in plan.nodes if n.name not in buffers]
    return replace(plan, nodes=nodes, stages=plan_stages(nodes))


def buffer_summary(plan: ExecutionPlan) -> str:
    """What `hybridflow check` prints of an async plan."""
    sides = sides_of(plan)
    k = sides.staleness
    streaming = any(n.buffer.streaming for n in buffer_nodes(plan))
    lines = [f"async: trainer.staleness={k}, trainer.async_mode=streaming (samples "
             f"generated continuously, admitted with weights up to {k} update(s) old)"
             if streaming else f"async: trainer.staleness={k} (batches generated with "
             f"weights up to {k} update(s) old)",
             f"  rollout side: {', '.join(sides.rollout)}",
             f"  train side:   {', '.join(sides.train)}"]
    edges = [f"{a} -> {b}" for a, b in sides.crossing_edges(plan)]
    lines.append(f"  handed over:  {', '.join(edges) or '-'}")
    for node in buffer_nodes(plan):
        readers = [n for n in plan.consumers(node.name)]
        lines.append(f"  buffer {node.name} -> {', '.join(readers)}: {node.buffer.describe()}")
    return "\n".join(lines)


def _buffer_section(plan: ExecutionPlan) -> str | None:
    return buffer_summary(plan) if buffer_nodes(plan) else None


SUMMARY_SECTIONS.append(_buffer_section)

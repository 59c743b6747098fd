"""Async training from the same graph: the rollout side, the train side, and the plans
that run them `trainer.staleness` steps apart.

With `trainer.staleness = k >= 1` the loop generates the batch of step t + k while it
trains step t. The compiler derives the two sides from the graph:

- the **rollout side**: the data sources, the generate node(s), and every node that
  depends only on them and does not read a trained role's current weights (rule
  rewards, a reward model, reference log-probs, group advantages, a gather);
- the **train side**: everything else (`actor.logprob`, `critic.values`, updates, the
  weight-sync edge).

Where the split is impossible (a generate node fed by the train side; a gather that
re-runs training) `split_sides` raises a `GraphError` naming the node. An update of
the generating policy trained ahead-of-time samples must correct for them (its loss
reads `rollout_log_probs`) unless the user opts out: `correction_problems`.

Three plans run the sides (`iteration_plans`):
- `rollout`: the rollout side alone (warm-up: the first k batches);
- `both`: one iteration — the train side of step t on the rollout outputs generated
  earlier (fed as `ready:<node>` sources holding the workers' outputs), and the
  rollout side of step t + k, with ordering edges so the new batch is generated
  with the weights from before this step's update (the weight sync waits for the
  generation; a colocated update waits for it too). Both runtimes then use the same
  weights version for the same batch. The train nodes that wait for nothing come
  first in its order, as workers run tasks in the order they are submitted;
- `train`: the train side alone (the last k steps, nothing left to generate).

Stateless: plans are built once per run from the compiled plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.plan.compiler import ExecutionPlan, GraphError, PlanNode, plan_stages
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.plan.weight_sync import LOAD_METHOD, weights_host

__all__ = ["Sides", "IterationPlans", "split_sides", "correction_problems", "iteration_plans",
           "attach_staleness", "READY", "CORRECTION_KEY"]

READY = "ready:"                      # prefix of the sources fed with earlier rollouts
CORRECTION_KEY = "rollout_log_probs"  # a loss reading it corrects for the behaviour policy


@dataclass(frozen=True)
class Sides:
    """The split of a plan's nodes (names in plan order)."""
    rollout: tuple[str, ...]
    train: tuple[str, ...]
    handoff: tuple[str, ...]           # rollout nodes the train side reads
    staleness: int

    def crossing_edges(self, plan: ExecutionPlan) -> list[tuple[str, str]]:
        """(rollout node, train node) edges: where the samples wait up to k steps."""
        rollout = set(self.rollout)
        return [(d, n) for n in self.train for d in plan.node(n).deps if d in rollout]

    def summary(self, plan: ExecutionPlan) -> str:
        lines = [f"async: trainer.staleness={self.staleness} (batches generated with weights "
                 f"up to {self.staleness} update(s) old)",
                 f"  rollout side: {', '.join(self.rollout)}",
                 f"  train side:   {', '.join(self.train)}"]
        edges = [f"{a} -> {b}" for a, b in self.crossing_edges(plan)]
        lines.append(f"  handed over:  {', '.join(edges) or '-'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class IterationPlans:
    rollout: ExecutionPlan
    both: ExecutionPlan
    train: ExecutionPlan


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
    a resume that re-draws the queued batches does not count them twice."""
    return node.op is Op.FN and callable(getattr(node.fn, "state_dict", None))


def split_sides(plan: ExecutionPlan, staleness: int) -> Sides:
    """The two sides of `plan`; GraphError naming the node when they cannot be split."""
    trained, rollout, problems = trained_roles(plan), set(), []
    for node in plan.nodes:
        ahead = all(d in rollout for d in node.deps)
        if node.kind is NodeKind.GENERATE and not ahead:
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
                or node.kind is NodeKind.GENERATE):  # e.g. `actor.generate`
            rollout.add(node.name)
    if not any(plan.node(n).kind is NodeKind.GENERATE for n in rollout) and not problems:
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
             if plan.node(n).kind is NodeKind.GENERATE}
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
    """`plan` with its sides (`plan.sides`) when `staleness >= 1`; GraphError when the
    split is impossible or an update goes uncorrected without the opt-out."""
    if staleness < 1:
        return plan
    sides = split_sides(plan, staleness)
    problems = [] if allow_uncorrected else \
        correction_problems(plan, sides, default_corrects)
    if problems:
        raise GraphError(plan.graph_name, problems)
    return replace(plan, sides=sides)


# ------------------------------------------------------------------ iteration plans
def _ready_source(node: PlanNode) -> PlanNode:
    """A source fed the node's output from an earlier step. Columns keep their
    writers' names (the batches carry them), only the dependency is renamed."""
    return PlanNode(READY + node.name, NodeKind.SOURCE, Op.SOURCE, (),
                    f"{node.location}; generated ahead, handed to the train side",
                    writes=node.writes, output_keys=dict(node.output_keys))


def _reading_ready(node: PlanNode, rollout: set[str]) -> PlanNode:
    """A train-side node reading the handed-over outputs instead of this iteration's."""
    return replace(node, deps=tuple(READY + d if d in rollout else d for d in node.deps))


def _waits_for_generation(node: PlanNode, shared: set[str], own: set[str]) -> bool:
    """A train-side node that changes the weights the rollout side samples with: the
    update of a host whose module the generation shares (colocated), or the weight
    sync loading a rollout role's own copy."""
    if node.op is not Op.CALL:
        return False
    return (node.kind.trains and node.role in shared) or \
        (node.method == LOAD_METHOD and node.role in own)


def _weight_owners(plan: ExecutionPlan, ahead: list[PlanNode]) -> tuple[set, set]:
    """(hosts whose module the generation shares, generating roles with weights of
    their own) among the rollout side's generate nodes."""
    shared, own = set(), set()
    for node in ahead:
        if node.kind is not NodeKind.GENERATE:
            continue
        host = _generator_host(plan, node)
        if node.role == host or plan.placement.folded.get(node.role) == host:
            shared.add(host)
        else:
            own.add(node.role)
    return shared, own


def _groups_read_later(plan: ExecutionPlan, sides: Sides) -> dict[str, tuple]:
    """Group-id columns (a grouped function's `group_by`) the train side reads from a
    handed-over output: the rollout side's run must report them with its rows."""
    rollout, out = set(sides.rollout), {}
    for name in sides.train:
        node = plan.node(name)
        if node.op is not Op.FN or not node.group_by:
            continue
        writer = node.input_keys.get(node.group_by)
        dep = next((d for d in node.deps if plan.node(d).output_keys.get(node.group_by)
                    == writer), None)
        if dep in rollout:
            out[dep] = tuple(sorted({*out.get(dep, ()), node.group_by}))
    return out


def _plan(plan: ExecutionPlan, nodes: list[PlanNode], suffix: str,
          handoff: dict[str, str] | None = None) -> ExecutionPlan:
    names = {n.name for n in nodes}
    groups = {n: k for n, k in _groups_read_later(plan, plan.sides).items() if n in names}
    return replace(plan, graph_name=f"{plan.graph_name}:{suffix}", nodes=nodes,
                   stages=plan_stages(nodes), warnings=[], handoff=dict(handoff or {}),
                   report_groups=groups)


def _train_first(train: list[PlanNode], ahead: list[PlanNode]) -> list[PlanNode]:
    """The async step's node order: the train nodes that wait for no rollout-side node
    first, then the rollout side, then the rest. The scheduler submits in plan order
    and a worker runs its tasks in submission order, so a rollout-side call queued
    first on a shared pool (a reward waiting for the generation) would hold back
    training that could already run."""
    rollout, behind, early = {n.name for n in ahead}, {n.name for n in train}, set()
    for node in train:  # topological order: a node's train-side deps are decided
        if all(d not in rollout and (d not in behind or d in early) for d in node.deps):
            early.add(node.name)
    return [n for n in train if n.name in early] + ahead + \
        [n for n in train if n.name not in early]


def iteration_plans(plan: ExecutionPlan) -> IterationPlans:
    """The rollout-only, both-sides and train-only plans of a plan with sides."""
    sides = plan.sides
    rollout = set(sides.rollout)
    ahead = [n for n in plan.nodes if n.name in rollout]
    ready = [_ready_source(plan.node(n)) for n in sides.handoff]
    handoff = {READY + n: n for n in sides.handoff}
    behind = [_reading_ready(plan.node(n), rollout) for n in sides.train]
    shared, own = _weight_owners(plan, ahead)
    samplers = tuple(n.name for n in ahead if n.op is Op.GATHER
                     or (n.op is Op.CALL and (n.role in own or n.role in shared
                                              or plan.placement.folded.get(n.role) in shared)))
    both_train = [replace(n, deps=n.deps + samplers)
                  if _waits_for_generation(n, shared, own) else n for n in behind]
    return IterationPlans(rollout=_plan(plan, ahead, "rollout side"),
                          both=_plan(plan, ready + _train_first(both_train, ahead),
                                     "async step", handoff),
                          train=_plan(plan, ready + behind, "train side", handoff))

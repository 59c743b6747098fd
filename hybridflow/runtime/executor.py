"""What an executor is, for the step scheduler: the interface a runtime implements
(`Executor`), the arguments of one task (`TaskArgs`), what a tracker records of a
submitted task (`TaskRecord`) and what is worked out once per plan (`PlanCache`:
which inputs feed each node, which group-id columns a node's output must report,
the part of the plan a gather re-runs, the executor's own per-node data such as
the pickled node on Ray).

State: a `PlanCache` (one per runtime) maps a plan, by identity and kept alive, to
its analysis; only its methods change it. `TaskArgs` lives for one task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.kinds import Op
from hybridflow.core.modes import RuntimeName
from hybridflow.runtime.common import NodeIO, input_columns, upstream_nodes
from hybridflow.runtime.worker_shell import ShardTask

__all__ = ["Executor", "PlanAnalysis", "PlanCache", "TaskArgs", "TaskRecord", "check_roles"]


@dataclass(slots=True)
class TaskRecord:
    """One submitted task, as the tracker keeps it until its meta is collected."""
    node: str
    pool: str
    rank: int
    slot: int | None               # output slot it fills; None: a helper task
    after: list                    # metas of the tasks whose outputs it reads
    submitted: float
    ref: Any = None                # its meta handle (an ObjectRef on Ray)
    done: float | None = None
    meta: dict | None = None


class Executor(Protocol):
    """What a runtime gives the scheduler. Handles are opaque: an ObjectRef or a
    Batch sent by value on Ray, a `local.Held` value locally.

    Ordering guarantee: the tasks `submit` sends to one worker (one pool's rank) run
    one at a time, in the order they were submitted, whatever order their arguments
    become ready in. The scheduler relies on it: it submits the train side's ready
    tasks before the rollout side's in a pass, so a reward queued behind a generation
    never holds back a log-prob pass on the same worker; and a task that reads an
    earlier task's output on the same worker needs no other synchronisation.
    `LocalRuntime` runs each task inline when it is submitted; `RayRuntime` submits
    to a synchronous Ray actor per rank (one thread: Ray runs a caller's tasks to an
    actor in submission order). Tasks to different workers have no order but their
    data dependencies."""
    name: RuntimeName       # what it can do (`process_per_rank`: a stream loop may thread)
    plans: "PlanCache"
    broken: str | None
    call_timeout_s: float   # bounds user code the scheduler runs itself (driver functions)

    def pool_size(self, pool: str) -> int: ...
    def roles_on(self, pool: str) -> list[str]: ...
    def node_id(self, plan: ExecutionPlan, node: PlanNode, pool: str, rank: int) -> Any: ...
    def submit(self, node: PlanNode, method: str, pool: str, rank: int, returns: int,
               task: ShardTask, args: list) -> list: ...   # output handles, then the meta
    def put(self, batch: Batch) -> tuple[Any, int]: ...     # handle, bytes through the driver
    def resolve(self, handles: list) -> tuple[list, int]: ...  # values, bytes fetched
    def is_ref(self, handle) -> bool: ...                   # tracked, not sent by value
    def value_bytes(self, value) -> int: ...                # a by-value argument's cost
    def tracker(self, plan: ExecutionPlan): ...


@dataclass
class PlanAnalysis:
    suppliers: dict[str, list[str]]        # node -> deps it reads at least one column from
    group_keys: dict[str, tuple[str, ...]]  # node -> group-id columns to report per row
    nodes: dict[str, PlanNode] = field(default_factory=dict)  # by name
    unread: dict[str, tuple[str, ...]] = field(default_factory=dict)  # deps for order only
    homes: dict[str, list] = field(default_factory=dict)  # put batch -> its slots' homes
    io: dict[str, NodeIO] = field(default_factory=dict)   # nodes the driver runs
    keeps: dict[str, bool] = field(default_factory=dict)  # node -> row_effect.keeps_partition
    node_ids: dict[str, Any] = field(default_factory=dict)  # the executor's, per node
    upstream: dict[str, ExecutionPlan] = field(default_factory=dict)  # re-run by gathers
    layouts: dict[str, tuple] = field(default_factory=dict)  # call -> (mode, layout, slots)
    roles_checked: bool = False   # every call's role runs in this runtime
    # submitted first in each sweep: the nodes reading a buffer, directly or not (the
    # train side), so their tasks queue ahead of the rollout's on a shared worker
    first: list[str] = field(default_factory=list)
    first_set: frozenset = frozenset()


def analyse(plan: ExecutionPlan) -> PlanAnalysis:
    suppliers: dict[str, list[str]] = {}
    group_keys: dict[str, set] = {}
    for node in plan.nodes:
        deps = []
        for key in input_columns(node):
            writer = node.input_keys.get(key)
            dep = next((d for d in node.deps if plan.node(d).output_keys.get(key) == writer),
                       None)
            if dep is not None and dep not in deps:
                deps.append(dep)
            if dep is not None and key == node.group_by and node.op is Op.FN:
                group_keys.setdefault(dep, set()).add(key)
        suppliers[node.name] = [d for d in node.deps if d in deps]
    for node in plan.nodes:  # a buffer's rows were made by its producer, steps earlier
        if node.op is Op.BUFFER and node.name in group_keys:
            group_keys.setdefault(node.buffer.producer, set()).update(group_keys[node.name])
    unread = {n.name: tuple(d for d in n.deps if d not in suppliers[n.name])
              for n in plan.nodes}
    first = _behind_buffers(plan)
    return PlanAnalysis(suppliers, {k: tuple(sorted(v)) for k, v in group_keys.items()},
                        {n.name: n for n in plan.nodes}, unread,
                        keeps={n.name: n.row_effect.keeps_partition for n in plan.nodes},
                        first=first, first_set=frozenset(first))


def _behind_buffers(plan: ExecutionPlan) -> list[str]:
    """The buffers and what reads them, directly or not, in plan order."""
    behind: set[str] = set()
    for node in plan.nodes:
        if node.op is Op.BUFFER or any(d in behind for d in node.deps):
            behind.add(node.name)
    return [n.name for n in plan.nodes if n.name in behind]


class PlanCache:
    """Per plan (by identity, the plan kept alive): its analysis, computed once."""

    def __init__(self):
        self._plans: dict[int, tuple[ExecutionPlan, PlanAnalysis]] = {}

    def analysis(self, plan: ExecutionPlan) -> PlanAnalysis:
        if id(plan) not in self._plans:
            self._plans[id(plan)] = (plan, analyse(plan))
        return self._plans[id(plan)][1]

    def upstream_plan(self, plan: ExecutionPlan, name: str) -> ExecutionPlan:
        """The part of `plan` a gather node re-runs: `name` and what it depends on."""
        cache = self.analysis(plan).upstream
        if name not in cache:
            nodes = upstream_nodes(plan, name)
            cache[name] = ExecutionPlan(plan.graph_name, nodes, plan.placement, plan.bindings,
                                        [[n.name] for n in nodes])
        return cache[name]

    def clear(self) -> None:
        self._plans.clear()


class TaskArgs:
    """Positional arguments of one task, each handle once; by-value ones are counted."""

    __slots__ = ("ex", "refs", "values", "_index")

    def __init__(self, executor: Executor):
        self.ex = executor
        self.refs: list = []
        self.values: list = []        # the by-value ones among `refs`
        self._index: dict = {}

    def add(self, ref) -> int:
        is_ref = self.ex.is_ref(ref)
        key = ref if is_ref else ("value", id(ref))
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.refs)
            self.refs.append(ref)
            if not is_ref:
                self.values.append(ref)
        return index

    def object_refs(self) -> list:
        if not self.values:
            return self.refs
        return [r for r in self.refs if self.ex.is_ref(r)]

    def value_bytes(self) -> int:
        """Bytes of the values sent with the task: they cross from the driver."""
        return sum(self.ex.value_bytes(r) for r in self.values) if self.values else 0


def check_roles(executor: Executor, plan: ExecutionPlan) -> None:
    """Refuse a plan whose calls name a role this runtime does not run (once a plan)."""
    analysis = executor.plans.analysis(plan)
    if analysis.roles_checked:
        return
    for node in plan.nodes:
        if node.op is Op.CALL and node.role not in executor.roles_on(node.pool):
            raise ValueError(f"{node.where()}: role '{node.role}' on pool '{node.pool}' "
                             f"is not running in this runtime")
    analysis.roles_checked = True

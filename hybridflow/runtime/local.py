"""Local runtime: executes an ExecutionPlan in this process.

An *executor* behind the step scheduler (`scheduler.StepScheduler` decides what a
step means; see there): every task it is given runs inline, at once, on an
in-process `FusedWorker` (the class the Ray runtime runs as an actor), so the two
runtimes share dispatch, resharding, function-node placement, gather rounds,
failures, metrics and the timeline. Handles are `Held` values, never copied.

State (all owned by `LocalRuntime`, changed only by its own methods):
- `ranks[pool]`: one dict per simulated rank, role -> worker instance; the roles of a
  pool share that dict (colocation: the same objects, so weights move in memory).
- `workers_of[pool]`: the in-process FusedWorker of each rank, over that dict.
- `role_pool`: role -> the pool it runs on (this plan's and the extra plans' roles).
- `plans`: the scheduler's per-plan analysis (`executor.PlanCache`).
A task names its node by (plan id, node name); each in-process worker keeps the node
object itself under that key (`node_id`: nothing is pickled).

Ranks of a pool are simulated in turn. Trained roles need a real process group to
stay in sync across ranks, so the local runtime refuses a trained role on more than
one rank; use the Ray runtime for data parallelism.
"""
from __future__ import annotations

import os

from collections.abc import Mapping
from typing import Any, Callable

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.core.modes import RuntimeName
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.runtime_section import RuntimeConfig
from hybridflow.core.deadline import call_with_deadline, handler_held
from hybridflow.core.origin import construct_role
from hybridflow.runtime.common import NodeFailure, StepResult
from hybridflow.runtime.executor import PlanCache, TaskRecord
from hybridflow.runtime.worker_shell import FusedWorker, WorkerError
from hybridflow.runtime.scheduler import run_step
from hybridflow.core.sections import read_section

__all__ = ["LocalRuntime", "Held", "Ran", "NodeBatches"]


def _make_context(rank: int, world_size: int, seed: int, colocated: dict):
    from hybridflow.core.context import WorkerContext
    return WorkerContext(rank=rank, world_size=world_size, local_rank=rank, device="cpu",
                         seed=seed, colocated=colocated)


class Held:
    """A value a local task made (a shard, a meta): a handle compared by identity."""
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class NodeBatches(Mapping):
    """A local step's outputs: node -> one Batch, its slots concatenated when first
    asked for (most nodes' outputs are never read on the driver)."""

    def __init__(self, outputs: dict, node_metrics: dict):
        self._outputs, self._metrics, self._batches = outputs, node_metrics, {}

    def __getitem__(self, name: str) -> Batch:
        if name not in self._batches:
            shards = [h.value for h in self._outputs[name].refs]
            batch = shards[0] if len(shards) == 1 else Batch.concat(shards)
            metrics = dict(self._metrics.get(name, {}))
            self._batches[name] = Batch._trusted(batch.tensors, batch.non_tensors,
                                                 {**batch.meta, "metrics": metrics})
        return self._batches[name]

    def handle(self, name: str):
        """The node's `NodeOutput` itself (its shards on the workers), e.g. to feed a
        later step."""
        return self._outputs[name]

    def __contains__(self, name) -> bool:
        return name in self._outputs

    def __iter__(self):
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)


class Ran:
    """The local tracker: every task ran when it was submitted (a failure raised
    there), so its meta only waits here for the scheduler to collect it."""

    def __init__(self, plan: ExecutionPlan):
        self.running: dict[Held, TaskRecord] = {}
        self.records: dict[str, list[TaskRecord]] = {}
        self.meta_of: dict = {}
        self.busy_s = 0.0  # the scheduler times its own work; tasks run inside it

    def add(self, node: str, pool: str, rank: int, meta: Held, slot, refs: list) -> None:
        """`refs` are unused: a task that ran needs no hang clock."""
        value = meta.value
        record = TaskRecord(node, pool, rank, slot, [], value["start"], meta, None, value)
        self.running[meta] = record
        records = self.records.get(node)
        if records is None:
            self.records[node] = [record]
        else:
            records.append(record)

    def wait(self, first: bool) -> tuple[list, list]:
        arrived = list(self.running.items())
        self.running.clear()
        return arrived, []

    def mark_done(self, ref, record: TaskRecord) -> None:
        record.done = record.meta["end"]  # it ran at submit

    def raise_first(self, failures: list) -> None:  # failures raise at submit
        raise AssertionError("local tasks report no failures later")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's or
    taskset's share), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class LocalRuntime:
    name = RuntimeName.LOCAL

    def __init__(self, plan: ExecutionPlan, cfg, seed: int = 0,
                 make_context: Callable = _make_context, extra_plans=()):
        """`extra_plans` (e.g. validation) run on the same workers; their roles start too."""
        self.plan, self.cfg, self.make_context = plan, cfg, make_context
        # user code (methods, function nodes) is bounded here as Ray bounds it
        settings = read_section(cfg, "runtime", RuntimeConfig)
        self.call_timeout_s = settings.call_timeout_s
        # the workers run in this process: by default the cores it may use (a real
        # model's passes scale with them). Tiny models on a busy machine may run faster
        # at runtime.torch_threads=1 (operators waiting at OpenMP barriers for
        # descheduled threads: 10-50x slower toy steps were measured)
        torch.set_num_threads(settings.torch_threads or available_cores())
        self.broken: str | None = None
        self.plans = PlanCache()
        self.ranks: dict[str, list[dict]] = {}
        self.workers_of: dict[str, list[FusedWorker]] = {}
        trained = {n.role for n in plan.nodes if n.kind.trains}
        self.role_pool = {}
        for p in (plan, *extra_plans):
            self.role_pool.update({r: p.placement.roles[r] for r in p.roles})
        for pool in plan.placement.pools:
            roles = [r for r, p in self.role_pool.items() if p == pool]
            if not roles:
                continue
            size = plan.placement.pools[pool].world_size
            if size > 1 and trained & set(roles):
                raise ValueError(
                    f"the local runtime cannot train role(s) {sorted(trained & set(roles))} "
                    f"on {size} ranks of pool '{pool}': set the pool to 1 device or use "
                    f"--runtime ray")
            self.ranks[pool] = [self._start_rank(pool, roles, r, size, seed)
                                for r in range(size)]
            self.workers_of[pool] = [FusedWorker.in_process(pool, r, size, held)
                                     for r, held in enumerate(self.ranks[pool])]

    def _start_rank(self, pool, roles, rank, size, seed) -> dict:
        colocated: dict = {}
        for role in roles:  # construction order = placement order, so ref can see actor
            ctx = self.make_context(rank, size, seed, colocated)
            colocated[role] = construct_role(role, self.plan.bindings[role], self.cfg, ctx)
        return colocated

    def workers(self, role: str) -> list:
        pool = self.role_pool[role]
        return [rank[role] for rank in self.ranks[pool]]

    # ------------------------------------------------- executor (scheduler.Executor)
    def pool_size(self, pool: str) -> int:
        return len(self.ranks[pool])

    def roles_on(self, pool: str) -> list[str]:
        return [r for r, p in self.role_pool.items() if p == pool and pool in self.ranks]

    def node_id(self, plan: ExecutionPlan, node: PlanNode, pool: str, rank: int) -> tuple:
        """The worker keeps the node object itself (the Ray runtime sends a digest);
        the plan cache keeps the plan alive, so its id names it."""
        key = (id(plan), node.name)
        nodes = self.workers_of[pool][rank].nodes
        if nodes.get(key) is not node:
            nodes[key] = node
        return key

    def submit(self, node: PlanNode, method: str, pool: str, rank: int, returns: int,
               task, args: list) -> list:
        values = [a.value if type(a) is Held else a for a in args]
        run = getattr(self.workers_of[pool][rank], method)
        try:
            out = call_with_deadline(lambda: run(task, *values), self.call_timeout_s,
                                     node.where(), "runtime.call_timeout_s")
        except WorkerError as err:  # in plan order, so this is the first failure
            raise NodeFailure(node, rank, err.detail, pool, err.cause) from None
        return [Held(v) for v in out]

    def put(self, batch: Batch):
        return Held(batch), 0  # nothing crosses a process

    def resolve(self, handles: list) -> tuple[list, int]:
        return [h.value if isinstance(h, Held) else h for h in handles], 0

    def is_ref(self, handle) -> bool:
        return type(handle) is Held

    def value_bytes(self, value) -> int:
        return 0

    def tracker(self, plan: ExecutionPlan) -> Ran:
        return Ran(plan)

    # ------------------------------------------------------------------- step
    def run_step(self, feeds: dict[str, Batch], plan: ExecutionPlan | None = None,
                 draw: Callable[[str], Batch] | None = None,
                 skip: frozenset = frozenset()) -> StepResult:
        """Run every node not in `skip` once. `feeds` gives each source node's batch
        (and each fed buffer's); `draw(source)` gives more, for gather nodes that need
        another round. Outputs are Batches."""
        with handler_held():  # each task's deadline then only sets a timer
            result = run_step(self, plan or self.plan, feeds, draw, skip)
        result.outputs = NodeBatches(result.outputs, result.node_metrics)
        return result

    def fetch(self, result: StepResult, node: str, keys) -> Batch:
        """Columns of a node's output, on the driver."""
        return result.outputs[node].select(*keys)

    def call_role(self, role: str, method: str, *args, **kwargs) -> list:
        """Call a method on every rank of a role (checkpointing, weight bytes)."""
        return self.call_each(role, method, [args] * len(self.workers(role)), **kwargs)

    def call_each(self, role: str, method: str, args_by_rank: list, **kwargs) -> list:
        """`method(*args_by_rank[r], **kwargs)` on each rank r of a role (None: rank r
        is not called; its reply is None). A failure is a NodeFailure naming
        `role.method` and the rank, as on Ray (the worker shell's `call`)."""
        pool = self.role_pool[role]
        node = PlanNode(f"{role}.{method}", NodeKind.INFERENCE, Op.CALL, (), "call_role",
                        role=role, method=method, pool=pool)
        replies = []
        for rank, (worker, args) in enumerate(zip(self.workers_of[pool], args_by_rank)):
            try:
                replies.append(None if args is None else
                               worker.call(role, method, tuple(args), kwargs))
            except WorkerError as err:
                raise NodeFailure(node, rank, err.detail, pool, err.cause) from None
        return replies

    def shutdown(self) -> None:
        self.ranks.clear()
        self.workers_of.clear()
        self.plans.clear()

"""One pass of a plan, for both runtimes: the step scheduler.

The scheduler decides everything a pass means: which nodes wait, which are ready,
which rows each rank of a call receives (the dispatch mode's `SlotLayout`), gather
rounds (re-running upstream nodes on fresh draws), where function nodes run (sharded
on the workers, whole on one worker, or on the driver), failures named by node,
role and rank (`NodeFailure`), metrics and the timeline. The runtimes are only
*executors* behind it (the pattern of Dask's `get_async`): `LocalRuntime` runs each
task inline when it is submitted, `RayRuntime` submits it to an actor and tracks it.
Both run the same worker code (`worker_shell.FusedWorker`). What outlives a pass (an
async plan's buffers) is the run scheduler's (run_long/run_scheduler.py): it feeds each pass
its buffered batches and says which side to skip.

State (one `StepScheduler` per `run_step`; only its own methods change it; workers
never see it, they only receive task descriptions):
- `waiting`: nodes not yet submitted and not skipped: the buffers and what reads them
  (the train side) first, then the rest, each in plan (topological) order. A sweep
  submits what it can in that order and repeats until it submits nothing, so on a
  worker shared by both sides the train side's tasks queue first (the executor runs
  a worker's tasks in submission order: `executor.Executor`).
- `outputs`: node -> NodeOutput, set when the node is submitted. Its `refs` (one per
  slot, concatenation = the node's output) exist at once; `rows`, `keys`, `groups`
  and `versions` are filled when every task of the node has reported (*done*).
- `tasks`: the executor's tracker of tasks in flight (`ray/tasks.InFlight` on Ray,
  `local.Ran` locally): records per node, per-actor queues, the hang clock.
- `result`: the StepResult being filled (metrics, timeline, driver bytes).

A waiting node is submitted as soon as its inputs allow (`reshard` says which rows
each slot takes), and after the nodes of its `after` that run in this pass:
- its inputs' shards line up with its slots (same slot count and row partition,
  known from a shared lineage or equal row counts): at once, the refs passed through;
- its layout has one slot (rank_zero, broadcast): at once, every shard to each rank;
- otherwise (reshard, a group check, a driver function): when its inputs are done,
  with the row ranges each rank must take.
A source takes its feed; a buffer its fed batch (a NodeOutput of an earlier pass, or
the rows a streaming rollout finished, a Batch the driver puts).
While some node waits for its inputs to be done the scheduler wakes on every
arrival; once every node is submitted it waits for all metas at once.

A runtime provides `executor.Executor`, and per plan an `executor.PlanCache`. The
node kinds in modules of their own (gather_rounds.py, stream_take.py) use a narrow
public surface, never a private method: `submit_task`, `set_output`, `put_output`,
`sub_pass`; they read `ex`, `plan`, `draw`, `outputs` and add to `result`.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import replace
from typing import Callable

from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.deadline import call_with_deadline
from hybridflow.core.failure_text import cause_line
from hybridflow.graph.dispatch import merge_metrics
from hybridflow.core.kinds import Op
from hybridflow.core.metric_names import node_scoped, timing_key
from hybridflow.runtime.common import NodeFailure, NodeIO, StepResult, run_fn_node
from hybridflow.runtime.gather_rounds import submit_gather
from hybridflow.runtime.stream_take import submit_stream_take
from hybridflow.runtime.executor import Executor, TaskArgs, check_roles
from hybridflow.runtime.layouts import home_slots, slot_layout
from hybridflow.runtime.outputs import NodeOutput, StreamTake
from hybridflow.runtime.reshard import grouped_inputs, slot_inputs, whole_inputs
from hybridflow.runtime.worker_shell import DepInput, Piece, ShardTask, group_hashes

__all__ = ["StepScheduler", "run_step", "keeps_state"]

# read on every node of every step: an Enum class attribute costs ~0.1 µs in 3.11
_SOURCE, _GATHER, _FN, _BUFFER = Op.SOURCE, Op.GATHER, Op.FN, Op.BUFFER


def keeps_state(node: PlanNode) -> bool:
    """A function node with state across steps (e.g. an adaptive KL coefficient) runs
    on the driver, where the loop checkpoints that state."""
    return callable(getattr(node.fn, "state_dict", None))


def run_step(executor: Executor, plan: ExecutionPlan, feeds: dict[str, Batch | NodeOutput],
             draw: Callable[[str], Batch] | None = None,
             skip: frozenset = frozenset()) -> StepResult:
    """One pass: every node of `plan` not in `skip` once; `draw(source)` gives more
    batches for gathers. A feed may be a `NodeOutput` of an earlier pass (a buffer's
    batch, generated ahead), used as it is, its shards never leaving the workers."""
    if executor.broken:
        raise RuntimeError(f"the runtime cannot run another step: {executor.broken}; "
                           f"shut it down and start a new one")
    check_roles(executor, plan)
    start = time.perf_counter()
    scheduler = StepScheduler(executor, plan, feeds, draw, skip)
    result = scheduler.run()
    result.metrics["runtime/driver_busy_s"] = scheduler.busy_s
    result.metrics["runtime/pass_s"] = time.perf_counter() - start
    return result


# ------------------------------------------------------------------ the step
class StepScheduler:
    def __init__(self, executor: Executor, plan: ExecutionPlan, feeds: dict[str, Batch],
                 draw=None, skip: frozenset = frozenset()):
        self.ex, self.plan, self.feeds, self.draw = executor, plan, feeds, draw
        self.skip, self.analysis = skip, executor.plans.analysis(plan)
        self.waiting: list[str] = [n for n in self.analysis.first if n not in skip] + \
            [n.name for n in plan.nodes if n.name not in skip
             and n.name not in self.analysis.first_set]
        self.outputs: dict[str, NodeOutput] = {}
        self.tasks = executor.tracker(plan)
        self.records = self.tasks.records
        self.meta_of = self.tasks.meta_of        # shard handle -> meta handle of its task
        self.group_keys = self.analysis.group_keys
        self.result = StepResult(outputs={})
        self._busy_s = 0.0

    @property
    def busy_s(self) -> float:
        """Driver time spent submitting and collecting, not blocked waiting."""
        return self._busy_s + self.tasks.busy_s

    # ------------------------------------------------------------------- loop
    def run(self) -> StepResult:
        while True:
            t0 = time.perf_counter()
            self._submit_ready()
            self._busy_s += time.perf_counter() - t0
            if not self.tasks.running:
                break
            self._wait()
        if self.waiting:  # every input is done, so only a bug can leave nodes here
            raise RuntimeError(f"nodes {self.waiting} were never submitted")
        self._finish_step()
        return self.result

    def _submit_ready(self) -> None:
        """Sweeps over `waiting`, in its order, until one submits nothing."""
        nodes = self.analysis.nodes
        while True:
            before = len(self.waiting)
            self.waiting = [name for name in self.waiting if not self._try_submit(nodes[name])]
            if len(self.waiting) == before or not self.analysis.first:
                return

    def _wait(self) -> None:
        arrived, failures = self.tasks.wait(first=bool(self.waiting))
        t0 = time.perf_counter()
        for ref, record in arrived:
            self._arrived(ref, record)
        if failures:
            self.tasks.raise_first(failures)
        self._busy_s += time.perf_counter() - t0

    def _arrived(self, ref, record) -> None:
        self.tasks.mark_done(ref, record)
        node = self.analysis.nodes[record.node]
        meta = record.meta
        self.result.timeline.append({"node": node.name, "role": node.role, "pool": record.pool,
                                     "rank": record.rank, "start": meta["start"],
                                     "end": meta["end"]})
        for other in self.records[node.name]:
            if other.done is None:
                return
        self._node_done(node)

    def _node_done(self, node: PlanNode) -> None:
        out = self.outputs[node.name]
        records = self.records[node.name]
        slots = [None] * len(out.refs)
        for r in records:
            if r.slot is not None:
                slots[r.slot] = r.meta
        slots = [meta for meta in slots if meta is not None]
        out.rows = [meta["rows"] for meta in slots]
        out.keys = list(slots[0]["keys"]) if slots else []
        out.groups = [meta["groups"] for meta in slots]
        out.nbytes = sum(meta["nbytes"] for meta in slots)
        if self.group_keys.get(node.name):
            self.result.driver_bytes += sum(self.ex.value_bytes(h) for g in out.groups
                                            for h in g.values())
        out.metrics = merge_metrics([meta["metrics"] for meta in slots], out.rows)
        for version, rows in (v for m in slots for v in m.get("versions", {}).items()):
            out.versions[version] = out.versions.get(version, 0) + rows
        self._record_node(node, out.metrics, [r.meta["start"] for r in records],
                          [r.meta["end"] for r in records])

    def _record_node(self, node: PlanNode, metrics: dict, starts: list, ends: list) -> None:
        self.result.node_metrics[node.name] = node_scoped(node.name, dict(metrics))
        self.result.rows[node.name] = self.outputs[node.name].num_rows or 0
        if starts:
            self.result.metrics[timing_key(node.name)] = max(ends) - min(starts)

    def _finish_step(self) -> None:
        merged = {}
        for node in self.plan.nodes:
            metrics = self.result.node_metrics.get(node.name)
            if metrics:
                merged.update(metrics)
        # result.metrics holds only the timing_s/ entries `_record_node` wrote so far
        self.result.metrics = {**merged, **self.result.metrics}
        self.result.outputs = dict(self.outputs)
        self.result.timeline.sort(key=lambda e: (e["start"], e["pool"] or "", e["rank"] or 0))

    # ---------------------------------------------------------------- submit
    def _try_submit(self, node: PlanNode) -> bool:
        op = node.op
        if op is _SOURCE:
            return self._submit_source(node)
        if op is _BUFFER:
            return self._submit_buffer(node)
        for dep in node.deps:
            if dep not in self.outputs:
                return False
        for dep in node.after:  # ordering only, and only when it runs in this pass
            if dep not in self.outputs and dep not in self.skip and dep in self.analysis.nodes:
                return False
        if op is _GATHER:
            return submit_gather(self, node)
        if op is _FN:
            first = self.outputs.get(node.deps[0]) if node.deps else None
            home = None if first is None else first.homes[0]
            if home is not None and (node.group_by or node.rows):
                return self._submit_sharded_fn(node)
            if home is not None and not keeps_state(node):
                return self._submit_whole_fn(node, home)
            return self._submit_driver_fn(node)
        return self._submit_call(node)

    def _submit_source(self, node: PlanNode) -> bool:
        if node.name not in self.feeds:
            raise ValueError(f"{node.where()}: no batch was fed to this source")
        feed = self.feeds[node.name]
        if isinstance(feed, NodeOutput):  # an earlier step's output, left on the workers
            self.outputs[node.name] = replace(feed, node=node.name)
            return True
        start = time.time()
        self.put_output(node, self._io(node).finish(self.feeds[node.name]), start)
        return True

    def _submit_buffer(self, node: PlanNode) -> bool:
        """Its fed batch (a producer's output of an earlier pass), or unfed, this
        pass's output once done (capacity 0: passes through)."""
        feed = self.feeds.get(node.name)
        if isinstance(feed, StreamTake):  # streamed groups, taken where they wait
            return submit_stream_take(self, node, feed)
        if isinstance(feed, Batch):  # rows the driver holds (tests, a fed batch)
            start = time.time()
            keys = node.output_keys  # the columns its producer's rows carry, and writers
            rows = feed.select(*[k for k in feed.keys() if k in keys])
            rows.meta = {"metrics": feed.meta.get("metrics", {}),
                         "_writers": {k: keys[k] for k in rows.keys()}}
            self.put_output(node, rows, start)
            return True
        if feed is None:
            produced = self.outputs.get(node.buffer.producer)
            if produced is None or not produced.done:
                return False
            feed = produced
        self.outputs[node.name] = replace(feed, node=node.name)
        return True

    def put_output(self, node: PlanNode, batch: Batch, start: float | None = None) -> None:
        """`node`'s output is a batch the driver holds, split for its first consumer
        (`layouts.home_slots`; the executor says what crossing costs: small shards on
        Ray travel inside each task), its metrics on record; `start`: the driver ran
        the node itself since then (one span on the timeline, no rank)."""
        homes = home_slots(self.ex, self.plan, self.analysis, node.name)
        # one home takes the batch as it is (`NodeIO.finish` made it a new Batch)
        shards = batch.split(len(homes)) if len(homes) > 1 else [batch]
        homes = homes or [None]
        refs = []
        for shard in shards:
            ref, sent = self.ex.put(shard)
            refs.append(ref)
            self.result.driver_bytes += sent
        keys = self.group_keys.get(node.name, ())
        groups = [{k: group_hashes(s[k]) for k in keys if k in s} for s in shards]
        if keys:
            self.result.driver_bytes += sum(self.ex.value_bytes(h) for g in groups
                                            for h in g.values())
        metrics = batch.meta.get("metrics", {})
        self.outputs[node.name] = NodeOutput(
            node.name, refs, homes, node.name, on_driver=True, rows=[len(s) for s in shards],
            keys=batch.keys(), groups=groups,
            nbytes=sum(self.ex.value_bytes(s) for s in shards), metrics=metrics)
        if start is None:
            self._record_node(node, metrics, [], [])
            return
        end = time.time()
        self._record_node(node, metrics, [start], [end])
        self.result.timeline.append({"node": node.name, "role": None, "pool": None,
                                     "rank": None, "start": start, "end": end})

    def _submit_driver_fn(self, node: PlanNode) -> bool:
        if not all(self.outputs[d].done for d in node.deps):
            return False
        start = time.time()
        inputs = {d: Batch() for d in node.deps}
        for dep in self.analysis.suppliers[node.name]:
            shards, fetched = self.ex.resolve(self.outputs[dep].refs)
            self.result.driver_bytes += fetched
            inputs[dep] = shards[0] if len(shards) == 1 else Batch.concat(shards)
        io = self._io(node)
        try:
            batch = io.assemble(inputs)
            out = call_with_deadline(lambda: run_fn_node(node, batch), self.ex.call_timeout_s,
                                     node.where(), "runtime.call_timeout_s")
            out = io.finish(out)
        except Exception as err:  # re-raised with the node named
            raise NodeFailure(node, None, traceback.format_exc(), cause=cause_line(err)) from err
        self.put_output(node, out, start)
        return True

    # ---- calls: a slot layout says which rows each rank receives
    def _submit_call(self, node: PlanNode) -> bool:
        # the call's mode, group layout and slot layout (once per plan and runtime)
        mode, layout, slots = slot_layout(self.ex, self.plan, self.analysis, node)
        if slots.slots == 1:  # every rank that runs takes the whole input, at once
            inputs, lineage = [whole_inputs(self._suppliers(node))], node.name
        else:
            planned = slot_inputs(node, self._suppliers(node), slots.slots,
                                  self.analysis.keeps[node.name])
            if planned is None:
                return False
            inputs, lineage = planned
        refs, homes = [None] * slots.slots, [None] * slots.slots
        pool = node.pool
        for rank, s, slot in slots.runs:
            shard = self._run(node, pool, rank, inputs[s], slot)
            if slot is not None:
                refs[slot], homes[slot] = shard, (pool, rank)
        self.outputs[node.name] = NodeOutput(node.name, refs, homes, lineage)
        return True

    # ---- function nodes on the workers
    def _submit_sharded_fn(self, node: PlanNode) -> bool:
        first = self.outputs[node.deps[0]]
        slots = len(first.refs)
        deps = self._suppliers(node)
        planned = grouped_inputs(node, deps, slots) if node.group_by else \
            slot_inputs(node, deps, slots, self.analysis.keeps[node.name])
        if planned is None:
            return False
        inputs, lineage = planned
        homes = list(first.homes)
        refs = [self._run(node, pool, rank, inputs[s], s) for s, (pool, rank) in enumerate(homes)]
        self.outputs[node.name] = NodeOutput(node.name, refs, homes, lineage)
        return True

    def _submit_whole_fn(self, node: PlanNode, home) -> bool:
        """A function over the whole batch (e.g. GAE, whose whitening is batch-wide)
        runs on the worker holding its first input's first shard: the other shards
        travel worker to worker, not through the driver."""
        pool, rank = home
        ref = self._run(node, pool, rank, whole_inputs(self._suppliers(node)), 0)
        self.set_output(node, [ref], [home])
        return True

    def _io(self, node: PlanNode) -> NodeIO:
        """What a node the driver runs reads and writes (once per plan)."""
        if node.name not in self.analysis.io:
            self.analysis.io[node.name] = NodeIO(node)
        return self.analysis.io[node.name]

    def _suppliers(self, node: PlanNode) -> list[NodeOutput]:
        return [self.outputs[d] for d in self.analysis.suppliers[node.name]]

    # ---- one worker task
    def _task(self, node: PlanNode, inputs: dict, args: TaskArgs, pool: str,
              rank: int) -> ShardTask:
        specs = {}
        for dep, spec in inputs.items():
            pieces = tuple([Piece(args.add(p.arg), p.rows) for p in spec.pieces])
            specs[dep] = DepInput(pieces, spec.index)
        for dep in self.analysis.unread[node.name] + node.after:  # ordering: no column read
            if dep not in inputs:
                for record in self.records.get(dep, ()):
                    args.add(record.ref)
        return ShardTask(self.ex.node_id(self.plan, node, pool, rank), specs,
                         group_keys=self.group_keys.get(node.name, ()))

    def _run(self, node: PlanNode, pool: str, rank: int, inputs: dict, slot):
        args = TaskArgs(self.ex)
        task = self._task(node, inputs, args, pool, rank)
        return self.submit_task(node, "run", pool, rank, args, slot, task=task)

    # ---- the public surface (gather_rounds.py, stream_take.py)
    def submit_task(self, node: PlanNode, method: str, pool: str, rank: int,
                    args: TaskArgs, slot, extra=(), task: ShardTask | None = None):
        """A task of `node` that makes one shard (`slot` of its output; None: a helper)
        by the worker shell's `method`, `extra` before its arguments; returns the
        shard's handle. `task`: the description (default: no planned inputs)."""
        if task is None:
            task = ShardTask(self.ex.node_id(self.plan, node, pool, rank), {},
                             group_keys=self.group_keys.get(node.name, ()))
        if args.values:
            self.result.driver_bytes += args.value_bytes()
        shard, meta = self.ex.submit(node, method, pool, rank, 2, task,
                                     [*extra, *args.refs] if extra else args.refs)
        self.tasks.add(node.name, pool, rank, meta, slot, args.object_refs())
        self.meta_of[shard] = meta
        return shard

    def set_output(self, node: PlanNode, refs: list, homes: list) -> None:
        """`node`'s output: one handle per slot, each slot's (pool, rank)."""
        self.outputs[node.name] = NodeOutput(node.name, refs, homes, node.name)

    def sub_pass(self, plan: ExecutionPlan, feeds: dict) -> StepResult:
        """A pass of `plan` (part of this one) on `feeds`, on the same executor."""
        return type(self)(self.ex, plan, feeds).run()

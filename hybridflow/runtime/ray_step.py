"""One step of a plan on Ray: the scheduler that submits nodes and collects their metas.

State (one `StepScheduler` per `run_step`; only its own methods change it; workers
never see it, they only receive task descriptions):
- `waiting`: nodes not yet submitted, in plan (topological) order.
- `outputs`: node -> NodeOutput, set when the node is submitted. Its `refs` (one per
  slot, concatenation = the node's output) exist at once; `rows` and `groups` are
  filled when every task of the node has reported (the node is *done*).
- `running`: meta ref -> TaskRecord for every worker task not yet reported.
- `queues`: (pool, rank) -> the records submitted to that actor, in order; Ray runs
  them in that order, so the head's clock (from when its actor went idle and its
  inputs were done) is what `call_timeout_s` bounds.
- `result`: the StepResult being filled (metrics, timeline, driver bytes).

A waiting node is submitted as soon as its inputs allow:
- its inputs' shards line up with its own ranks (same slot count and row partition,
  known from a shared lineage or equal row counts): at once, the refs passed through;
- it needs the whole input on one rank (rank_zero, broadcast, user-defined modes):
  at once, every shard passed to that rank;
- otherwise (reshard, a group check, a driver function): when its inputs are done,
  with the row ranges each rank must take.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from hybridflow.batch import Batch, split_indices
from hybridflow.compiler import ExecutionPlan, PlanNode
from hybridflow.dispatch import (BROADCAST, DP, DP_TP, RANK_ZERO, Layout, get_dispatch_mode,
                                 merge_metrics)
from hybridflow.runtime.common import (NodeFailure, StepResult, assemble_input, finish_gather,
                                       finish_output, run_fn_node, sum_round_metrics)
from hybridflow.runtime.ray_worker import (DepInput, Piece, ShardTask, failure_detail,
                                           group_hashes, payload_bytes)

__all__ = ["NodeOutput", "StepScheduler"]


@dataclass
class NodeOutput:
    """A node's output left on the workers: the concatenation of `refs` in slot order."""
    node: str
    refs: list
    homes: list                    # (pool, rank) holding or owning each slot; None: no pool
    lineage: str                   # outputs of one lineage share their row partition
    on_driver: bool = False        # put by the driver (a feed or a driver fn)
    rows: list[int] | None = None  # per slot, once done
    keys: list[str] | None = None  # columns, once done
    groups: list[dict] | None = None
    nbytes: int = 0
    metrics: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.rows is not None

    @property
    def num_rows(self) -> int | None:
        return None if self.rows is None else sum(self.rows)


@dataclass
class TaskRecord:
    node: str
    pool: str
    rank: int
    slot: int | None               # output slot it fills; None: a helper task
    after: list                    # metas of the tasks whose outputs it reads
    submitted: float
    ref: Any = None                # its meta ObjectRef
    done: float | None = None
    meta: dict | None = None


class _Args:
    """Positional arguments of one task, each ref once."""

    def __init__(self):
        self.refs: list = []
        self._index: dict = {}

    def add(self, ref) -> int:
        if ref not in self._index:
            self._index[ref] = len(self.refs)
            self.refs.append(ref)
        return self._index[ref]


class StepScheduler:
    def __init__(self, runtime, plan: ExecutionPlan, feeds: dict[str, Batch], draw=None):
        self.rt, self.plan, self.feeds, self.draw = runtime, plan, feeds, draw
        self.timeout = runtime.settings.call_timeout_s
        self.order = {n.name: i for i, n in enumerate(plan.nodes)}
        self.waiting: list[str] = [n.name for n in plan.nodes]
        self.outputs: dict[str, NodeOutput] = {}
        self.running: dict[Any, TaskRecord] = {}
        self.records: dict[str, list[TaskRecord]] = collections.defaultdict(list)
        self.meta_of: dict[Any, Any] = {}          # shard ref -> meta ref of its task
        self.done_at: dict[Any, float] = {}        # meta ref -> when it arrived
        self.queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self.idle_since: dict[tuple, float] = {}
        self.group_keys = runtime.analysis(plan).group_keys
        self.result = StepResult(outputs={})
        self.busy_s = 0.0

    # ------------------------------------------------------------------- loop
    def run(self) -> StepResult:
        while True:
            t0 = time.perf_counter()
            self._submit_ready()
            self.busy_s += time.perf_counter() - t0
            if not self.running:
                break
            self._wait()
        if self.waiting:  # every input is done, so only a bug can leave nodes here
            raise RuntimeError(f"nodes {self.waiting} were never submitted")
        self._finish_step()
        return self.result

    def _submit_ready(self) -> None:
        for name in list(self.waiting):
            if self._try_submit(self.plan.node(name)):
                self.waiting.remove(name)

    def _wait(self) -> None:
        deadline, head = self._next_deadline()
        ready, _ = ray.wait(list(self.running), num_returns=1,
                            timeout=max(0.0, deadline - time.time()))
        if not ready:
            if head is None:  # no task could start: name the first one still running
                head = min(self.running.values(), key=lambda r: (self.order[r.node], r.rank))
            self.rt.broken = f"node '{head.node}' timed out on rank {head.rank}"
            raise NodeFailure(self.plan.node(head.node), head.rank,
                              f"no result from rank {head.rank} of pool '{head.pool}' "
                              f"within runtime.call_timeout_s={self.timeout:g}s: the "
                              f"worker hangs or its process died")
        t0 = time.perf_counter()
        ready, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        failures = []
        for ref in ready:
            record = self.running.pop(ref)
            try:
                record.meta = ray.get(ref, timeout=self.timeout)
            except ray.exceptions.RayError as err:
                failures.append((self.order[record.node], record.rank, record, err))
                continue
            self._arrived(ref, record)
        if failures:
            self._raise_first(failures)
        self.busy_s += time.perf_counter() - t0

    def _raise_first(self, failures) -> None:
        _, rank, record, err = min(failures, key=lambda f: (f[0], f[1]))
        detail = failure_detail(err)
        if isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)):
            self.rt.broken = f"the worker of pool '{record.pool}' rank {rank} died"
            detail = (f"the worker process of pool '{record.pool}' rank {rank} died; the "
                      f"runtime must be restarted.\n{detail}")
        raise NodeFailure(self.plan.node(record.node), rank, detail) from None

    def _next_deadline(self) -> tuple[float, TaskRecord | None]:
        """Earliest deadline among the tasks at the head of their actor's queue whose
        inputs are done (the only ones that can be running)."""
        best, head = time.time() + self.timeout, None
        for key, queue in self.queues.items():
            while queue and queue[0].done is not None:
                queue.popleft()
            if not queue:
                continue
            task = queue[0]
            if any(ref not in self.done_at for ref in task.after):
                continue
            start = max([task.submitted, self.idle_since.get(key, 0.0),
                         *(self.done_at[r] for r in task.after)])
            if start + self.timeout < best:
                best, head = start + self.timeout, task
        return best, head

    def _arrived(self, ref, record: TaskRecord) -> None:
        now = time.time()
        record.done = now
        self.done_at[ref] = now
        self.idle_since[(record.pool, record.rank)] = now
        node = self.plan.node(record.node)
        meta = record.meta
        self.result.timeline.append({"node": node.name, "role": node.role, "pool": record.pool,
                                     "rank": record.rank, "start": meta["start"],
                                     "end": meta["end"]})
        if all(r.done is not None for r in self.records[node.name]):
            self._node_done(node)

    def _node_done(self, node: PlanNode) -> None:
        out = self.outputs[node.name]
        slots = sorted((r for r in self.records[node.name] if r.slot is not None),
                       key=lambda r: r.slot)
        out.rows = [r.meta["rows"] for r in slots]
        out.keys = list(slots[0].meta["keys"]) if slots else []
        out.groups = [r.meta["groups"] for r in slots]
        out.nbytes = sum(r.meta["nbytes"] for r in slots)
        self.result.driver_bytes += sum(h.nbytes for g in out.groups for h in g.values())
        out.metrics = merge_metrics([r.meta["metrics"] for r in slots])
        self._record_node(node, out.metrics,
                          [(r.meta["start"], r.meta["end"]) for r in self.records[node.name]])

    def _record_node(self, node: PlanNode, metrics: dict, spans: list) -> None:
        self.result.node_metrics[node.name] = dict(metrics)
        if spans:
            self.result.metrics[f"timing_s/{node.name}"] = (max(e for _, e in spans)
                                                            - min(s for s, _ in spans))

    def _finish_step(self) -> None:
        merged = {}
        for node in self.plan.nodes:
            merged.update(self.result.node_metrics.get(node.name, {}))
        timing = {k: v for k, v in self.result.metrics.items() if k.startswith("timing_s/")}
        self.result.metrics = {**merged, **timing}
        self.result.outputs = dict(self.outputs)
        self.result.timeline.sort(key=lambda e: (e["start"], e["pool"] or "", e["rank"] or 0))

    # ---------------------------------------------------------------- submit
    def _try_submit(self, node: PlanNode) -> bool:
        if node.op == "source":
            return self._submit_source(node)
        if any(d not in self.outputs for d in node.deps):
            return False
        if node.op == "gather":
            return self._submit_gather(node)
        if node.op == "fn":
            if (node.group_by or node.rows) and self._pool_of_first(node) is not None:
                return self._submit_sharded_fn(node)
            return self._submit_driver_fn(node)
        mode = node.dispatch
        if mode in (DP, DP_TP):
            return self._submit_data_parallel(node)
        if mode in (RANK_ZERO, BROADCAST):
            return self._submit_whole(node)
        return self._submit_generic(node)

    def _submit_source(self, node: PlanNode) -> bool:
        if node.name not in self.feeds:
            raise ValueError(f"{node.where()}: no batch was fed to this source")
        self._put(node, finish_output(node, self.feeds[node.name]))
        now = time.time()
        self._record_node(node, self.outputs[node.name].metrics, [(now, now)])
        return True

    def _put(self, node: PlanNode, batch: Batch) -> None:
        """A batch from the driver into the object store, split for its first consumer."""
        homes = self.rt.home_slots(self.plan, node.name)
        shards = batch.split(len(homes)) if homes else [batch]
        homes = homes or [None]
        refs = [ray.put(s) for s in shards]
        self.result.driver_bytes += sum(payload_bytes(s) for s in shards)
        keys = self.group_keys.get(node.name, ())
        groups = [{k: group_hashes(s[k]) for k in keys if k in s} for s in shards]
        self.result.driver_bytes += sum(h.nbytes for g in groups for h in g.values())
        self.outputs[node.name] = NodeOutput(
            node.name, refs, homes, node.name, on_driver=True, rows=[len(s) for s in shards],
            keys=batch.keys(),
            groups=groups, nbytes=sum(payload_bytes(s) for s in shards),
            metrics=batch.meta.get("metrics", {}))

    def _submit_driver_fn(self, node: PlanNode) -> bool:
        if not all(self.outputs[d].done for d in node.deps):
            return False
        sources = self.rt.analysis(self.plan).suppliers[node.name]
        start = time.time()
        inputs = {d: Batch() for d in node.deps}
        for dep in sources:
            shards = ray.get(self.outputs[dep].refs, timeout=self.timeout)
            self.result.driver_bytes += sum(payload_bytes(s) for s in shards)
            inputs[dep] = shards[0] if len(shards) == 1 else Batch.concat(shards)
        try:
            out = finish_output(node, run_fn_node(node, assemble_input(node, inputs)))
        except Exception as err:  # noqa: BLE001 - re-raised with the node named
            import traceback
            raise NodeFailure(node, None, traceback.format_exc()) from err
        self._put(node, out)
        end = time.time()
        self.outputs[node.name].metrics = out.meta.get("metrics", {})
        self._record_node(node, self.outputs[node.name].metrics, [(start, end)])
        self.result.timeline.append({"node": node.name, "role": None, "pool": None,
                                     "rank": None, "start": start, "end": end})
        return True

    def _submit_gather(self, node: PlanNode) -> bool:
        """Re-run the nodes upstream of the gathered one on fresh source batches (one
        sub-step a round) until it has `until` rows or `max_rounds` extra rounds ran;
        then the first `until` rows, concatenated on the worker holding the first."""
        dep = node.deps[0]
        if not self.outputs[dep].done:
            return False
        until, max_rounds = node.kwargs["until"], node.kwargs["max_rounds"]
        upstream = self.rt.upstream_plan(self.plan, dep)
        pieces, rounds = [self.outputs[dep]], 0
        history = {n.name: [self.result.node_metrics.get(n.name, {})] for n in upstream.nodes}
        while sum(p.num_rows for p in pieces) < until and self.draw is not None \
                and rounds < max_rounds:
            feeds = {n.name: self.draw(n.name) for n in upstream.nodes if n.op == "source"}
            sub = StepScheduler(self.rt, upstream, feeds).run()
            pieces.append(sub.outputs[dep])
            self.result.driver_bytes += sub.driver_bytes
            self.result.timeline += sub.timeline
            for name, metrics in sub.node_metrics.items():
                history[name].append(metrics)
            rounds += 1
        for name, metrics in history.items():
            self.result.node_metrics[name] = sum_round_metrics(metrics)
        refs = [ref for p in pieces for ref in p.refs]
        home = pieces[0].homes[0]
        if home is None:  # the gathered node ran on the driver
            shards = ray.get(refs, timeout=self.timeout)
            self.result.driver_bytes += sum(payload_bytes(b) for b in shards)
            out = finish_gather(node, shards, rounds)
            self._put(node, out)
            self._record_node(node, out.meta["metrics"], [])
            return True
        pool, rank = home
        args = _Args()
        for ref in refs:
            args.add(ref)
        shard, meta = self.rt.actors(pool)[rank].gather.options(num_returns=2).remote(
            ShardTask(self.rt.shipped(self.plan, node),
                      group_keys=self.group_keys.get(node.name, ())), rounds, *args.refs)
        self._record(node, pool, rank, meta, 0, args.refs)
        self.meta_of[shard] = meta
        self.outputs[node.name] = NodeOutput(node.name, [shard], [home], node.name)
        return True

    # ---- data-parallel calls and sharded functions: one slot per rank (group)
    def _submit_data_parallel(self, node: PlanNode) -> bool:
        pool = node.pool
        size, tp = self.rt.pool_size(pool), self.rt.tp_size(self.plan, node.role)
        if node.dispatch == DP:
            tp = 1
        if size % tp:
            raise NodeFailure(node, None, f"pool '{pool}' has {size} ranks, not a multiple "
                                          f"of the tensor-parallel size {tp}")
        slot_inputs = self._slot_inputs(node, size // tp)
        if slot_inputs is None:
            return False
        inputs, lineage = slot_inputs
        refs = [None] * (size // tp)
        for rank in range(size):
            shard = self._run(node, pool, rank, inputs[rank // tp],
                              slot=rank // tp if rank % tp == 0 else None)
            if rank % tp == 0:
                refs[rank // tp] = shard
        homes = [(pool, s * tp) for s in range(size // tp)]
        self.outputs[node.name] = NodeOutput(node.name, refs, homes, lineage)
        return True

    def _submit_sharded_fn(self, node: PlanNode) -> bool:
        first = self.outputs[node.deps[0]]
        slots = len(first.refs)
        if node.group_by:
            slot_inputs = self._grouped_inputs(node, slots)
        else:
            slot_inputs = self._slot_inputs(node, slots)
        if slot_inputs is None:
            return False
        inputs, lineage = slot_inputs
        homes = list(first.homes)
        refs = [self._run(node, pool, rank, inputs[s], slot=s)
                for s, (pool, rank) in enumerate(homes)]
        self.outputs[node.name] = NodeOutput(node.name, refs, homes, lineage)
        return True

    def _pool_of_first(self, node: PlanNode):
        out = self.outputs.get(node.deps[0]) if node.deps else None
        if out is None or out.homes[0] is None:
            return None
        return out.homes[0]

    def _slot_inputs(self, node: PlanNode, slots: int):
        """Per slot, the DepInput of every supplying dep, and the output's lineage;
        None while row counts needed for a reshard are unknown."""
        deps = [self.outputs[d] for d in self.rt.analysis(self.plan).suppliers[node.name]]
        if self._aligned(deps, slots):
            inputs = [{d.node: DepInput((Piece(d.refs[s]),)) for d in deps}
                      for s in range(slots)]
            lineage = deps[0].lineage if deps and node.kind != "generate" else node.name
            return inputs, lineage
        if not all(d.done for d in deps):
            return None
        inputs = [{} for _ in range(slots)]
        for dep in deps:
            offsets = np.cumsum([0, *dep.rows])
            for s, rows in enumerate(np.array_split(np.arange(offsets[-1]), slots)):
                lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
                inputs[s][dep.node] = _range_pieces(dep, offsets, lo, hi)
        return inputs, node.name

    def _grouped_inputs(self, node: PlanNode, slots: int):
        """Shards that hold whole groups run as they are; otherwise regroup."""
        deps = [self.outputs[d] for d in self.rt.analysis(self.plan).suppliers[node.name]]
        if not all(d.done for d in deps):
            return None
        key = node.group_by
        keyed = next((d for d in deps if any(key in g for g in d.groups)), None)
        if keyed is None:
            raise NodeFailure(node, None, f"group_by key '{key}' reached the node from none "
                                          f"of its inputs")
        per_slot = [g.get(key, np.empty(0, np.uint64)) for g in keyed.groups]
        whole = sum(len(np.unique(h)) for h in per_slot) == \
            len(np.unique(np.concatenate(per_slot)))
        if whole and self._aligned(deps, slots) and len(keyed.refs) == slots:
            return self._slot_inputs(node, slots)
        ids = Batch(non_tensors={key: np.concatenate(per_slot)})
        inputs = [{} for _ in range(slots)]
        for s, index in enumerate(split_indices(ids, slots, group_by=key)):
            for dep in deps:
                inputs[s][dep.node] = _index_pieces(dep, index)
        return inputs, node.name

    @staticmethod
    def _aligned(deps: list[NodeOutput], slots: int) -> bool:
        if any(len(d.refs) != slots for d in deps):
            return False
        if len({d.lineage for d in deps}) <= 1:
            return True
        return all(d.done for d in deps) and len({tuple(d.rows) for d in deps}) == 1

    # ---- modes that need the whole input on a rank
    def _submit_whole(self, node: PlanNode) -> bool:
        inputs = self._whole_inputs(node)
        ranks = [0] if node.dispatch == RANK_ZERO else range(self.rt.pool_size(node.pool))
        refs = [self._run(node, node.pool, rank, inputs, slot=0 if rank == 0 else None)
                for rank in ranks]
        self.outputs[node.name] = NodeOutput(node.name, refs[:1], [(node.pool, 0)], node.name)
        return True

    def _whole_inputs(self, node: PlanNode) -> dict:
        deps = [self.outputs[d] for d in self.rt.analysis(self.plan).suppliers[node.name]]
        return {d.node: DepInput(tuple(Piece(r) for r in d.refs)) for d in deps}

    def _submit_generic(self, node: PlanNode) -> bool:
        """A user-defined mode (or one_per_worker): rank 0 runs the mode's dispatch on
        the whole input and its collect on the ranks' results."""
        pool, size = node.pool, self.rt.pool_size(node.pool)
        layout = Layout(size, self.rt.tp_size(self.plan, node.role))
        actors = self.rt.actors(pool)
        args, mode = _Args(), get_dispatch_mode(node.dispatch)
        task = self._task(node, self._whole_inputs(node), args)
        task.mode = mode
        *parts, meta = actors[0].scatter.options(num_returns=size + 1).remote(
            task, layout, *args.refs)
        self._record(node, pool, 0, meta, None, args.refs)
        self.meta_of.update({part: meta for part in parts})
        raw = []
        for rank, part in enumerate(parts):
            shard, meta = actors[rank].run.options(num_returns=2).remote(
                ShardTask(self.rt.shipped(self.plan, node), prepared=True, finish=False), part)
            self._record(node, pool, rank, meta, None, [part])
            self.meta_of[shard] = meta
            raw.append(shard)
        shard, meta = actors[0].collect.options(num_returns=2).remote(
            ShardTask(self.rt.shipped(self.plan, node), group_keys=self.group_keys.get(node.name, ()),
                      mode=mode), layout,
            *raw)
        self._record(node, pool, 0, meta, 0, raw)
        self.meta_of[shard] = meta
        self.outputs[node.name] = NodeOutput(node.name, [shard], [(pool, 0)], node.name)
        return True

    # ---- one worker task
    def _task(self, node: PlanNode, inputs: dict, args: _Args) -> ShardTask:
        specs = {}
        for dep, spec in inputs.items():
            pieces = tuple(Piece(args.add(p.arg), p.rows) for p in spec.pieces)
            specs[dep] = DepInput(pieces, spec.index)
        for dep in node.deps:  # ordering only: a dep whose columns it does not read
            if dep not in inputs:
                for record in self.records.get(dep, []):
                    args.add(record.ref)
        return ShardTask(self.rt.shipped(self.plan, node), specs,
                         group_keys=self.group_keys.get(node.name, ()))

    def _run(self, node: PlanNode, pool: str, rank: int, inputs: dict, slot):
        args = _Args()
        task = self._task(node, inputs, args)
        shard, meta = self.rt.actors(pool)[rank].run.options(num_returns=2).remote(
            task, *args.refs)
        self._record(node, pool, rank, meta, slot, args.refs)
        self.meta_of[shard] = meta
        return shard

    def _record(self, node, pool, rank, meta, slot, arg_refs) -> None:
        after = [self.meta_of.get(r, r) for r in arg_refs
                 if r in self.meta_of or r in self.running or r in self.done_at]
        record = TaskRecord(node.name, pool, rank, slot, after, time.time(), ref=meta)
        self.running[meta] = record
        self.records[node.name].append(record)
        self.queues[(pool, rank)].append(record)


def _range_pieces(dep: NodeOutput, offsets, lo: int, hi: int) -> DepInput:
    """Rows [lo, hi) of a dep's concatenated shards; an empty range keeps the columns."""
    pieces = []
    for j, ref in enumerate(dep.refs):
        a, b = max(lo, offsets[j]), min(hi, offsets[j + 1])
        if a < b:
            whole = a == offsets[j] and b == offsets[j + 1]
            pieces.append(Piece(ref, None if whole else slice(int(a - offsets[j]),
                                                               int(b - offsets[j]))))
    return DepInput(tuple(pieces) or (Piece(dep.refs[0], slice(0, 0)),))


def _index_pieces(dep: NodeOutput, index: np.ndarray) -> DepInput:
    """Rows `index` (any order) of a dep's concatenated shards."""
    offsets = np.cumsum([0, *dep.rows])
    used = sorted({int(np.searchsorted(offsets, i, side="right") - 1) for i in index})
    if not used:
        return DepInput((Piece(dep.refs[0], slice(0, 0)),))
    base = {j: int(sum(dep.rows[k] for k in used if k < j)) for j in used}
    shard = np.searchsorted(offsets, index, side="right") - 1
    local = np.array([base[int(j)] + int(i - offsets[j]) for i, j in zip(index, shard)],
                     dtype=np.int64)
    return DepInput(tuple(Piece(dep.refs[j]) for j in used), local)

"""One step of a plan on Ray: the scheduler that submits nodes and collects their metas.

State (one `StepScheduler` per `run_step`; only its own methods change it; workers
never see it, they only receive task descriptions):
- `waiting`: nodes not yet submitted, in plan (topological) order.
- `outputs`: node -> NodeOutput, set when the node is submitted. Its `refs` (one per
  slot, concatenation = the node's output) exist at once; `rows` and `groups` are
  filled when every task of the node has reported (the node is *done*). A slot the
  driver holds and that is small (a seed or prompt shard) is the Batch itself, sent
  by value with each task that reads it; larger ones are `ray.put`.
- `tasks`: the worker tasks in flight (`ray_tasks.InFlight`: records, per-actor
  queues, the hang clock that `call_timeout_s` bounds).
- `result`: the StepResult being filled (metrics, timeline, driver bytes).

A waiting node is submitted as soon as its inputs allow (`ray_reshard` says which
rows each slot takes):
- its inputs' shards line up with its own ranks (same slot count and row partition,
  known from a shared lineage or equal row counts): at once, the refs passed through;
- it needs the whole input on one rank (rank_zero, broadcast, user-defined modes):
  at once, every shard passed to that rank;
- otherwise (reshard, a group check, a driver function): when its inputs are done,
  with the row ranges each rank must take.
While some node waits for its inputs to be done the scheduler wakes on every
arrival; once every node is submitted it waits for all metas at once (waking at
least every `ray_tasks.POLL_S` to report a failed task without waiting for the rest).
"""
from __future__ import annotations

import time

import ray

from hybridflow.batch import Batch
from hybridflow.compiler import ExecutionPlan, PlanNode
from hybridflow.dispatch import (BROADCAST, DP, DP_TP, RANK_ZERO, Layout, get_dispatch_mode,
                                 merge_metrics)
from hybridflow.runtime.common import (NodeFailure, StepResult, assemble_input, finish_gather,
                                       finish_output, run_fn_node, sum_round_metrics)
from hybridflow.runtime.ray_outputs import NodeOutput
from hybridflow.runtime.ray_reshard import grouped_inputs, slot_inputs, whole_inputs
from hybridflow.runtime.ray_tasks import InFlight, TaskArgs, TaskRecord, resolve
from hybridflow.runtime.ray_worker import (DepInput, Piece, ShardTask, group_hashes,
                                           payload_bytes)

__all__ = ["NodeOutput", "StepScheduler", "INLINE_BYTES"]

INLINE_BYTES = 64 * 1024  # driver-held shards up to this size travel inside the tasks


def keeps_state(node: PlanNode) -> bool:
    """A function node with state across steps (e.g. an adaptive KL coefficient) runs
    on the driver, where the loop checkpoints that state."""
    return callable(getattr(node.fn, "state_dict", None))


class StepScheduler:
    def __init__(self, runtime, plan: ExecutionPlan, feeds: dict[str, Batch], draw=None):
        self.rt, self.plan, self.feeds, self.draw = runtime, plan, feeds, draw
        self.timeout = runtime.settings.call_timeout_s
        self.waiting: list[str] = [n.name for n in plan.nodes]
        self.outputs: dict[str, NodeOutput] = {}
        self.tasks = InFlight(runtime, plan)
        self.records = self.tasks.records
        self.meta_of = self.tasks.meta_of        # shard ref -> meta ref of its task
        self.group_keys = runtime.analysis(plan).group_keys
        self.result = StepResult(outputs={})
        self._busy_s = 0.0

    @property
    def busy_s(self) -> float:
        """Driver time spent submitting and collecting, not blocked in `ray.wait`."""
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
        for name in list(self.waiting):
            if self._try_submit(self.plan.node(name)):
                self.waiting.remove(name)

    def _wait(self) -> None:
        arrived, failures = self.tasks.wait(first=bool(self.waiting))
        t0 = time.perf_counter()
        for ref, record in arrived:
            self._arrived(ref, record)
        if failures:
            self.tasks.raise_first(failures)
        self._busy_s += time.perf_counter() - t0

    def _arrived(self, ref, record: TaskRecord) -> None:
        self.tasks.mark_done(ref, record)
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
        self.result.rows[node.name] = sum(out.rows)
        out.keys = list(slots[0].meta["keys"]) if slots else []
        out.groups = [r.meta["groups"] for r in slots]
        out.nbytes = sum(r.meta["nbytes"] for r in slots)
        self.result.driver_bytes += sum(h.nbytes for g in out.groups for h in g.values())
        out.metrics = merge_metrics([r.meta["metrics"] for r in slots], out.rows)
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
            home = self._pool_of_first(node)
            if home is not None and (node.group_by or node.rows):
                return self._submit_sharded_fn(node)
            if home is not None and not keeps_state(node):
                return self._submit_whole_fn(node, home)
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
        """A batch from the driver, split for its first consumer: small shards are
        kept to be sent by value with each task that reads them (counted then),
        larger ones go into the object store once (counted here)."""
        homes = self.rt.home_slots(self.plan, node.name)
        shards = batch.split(len(homes)) if homes else [batch]
        homes = homes or [None]
        sizes = [payload_bytes(s) for s in shards]
        refs = [s if size <= INLINE_BYTES else ray.put(s) for s, size in zip(shards, sizes)]
        self.result.driver_bytes += sum(size for size in sizes if size > INLINE_BYTES)
        keys = self.group_keys.get(node.name, ())
        groups = [{k: group_hashes(s[k]) for k in keys if k in s} for s in shards]
        self.result.driver_bytes += sum(h.nbytes for g in groups for h in g.values())
        self.outputs[node.name] = NodeOutput(
            node.name, refs, homes, node.name, on_driver=True, rows=[len(s) for s in shards],
            keys=batch.keys(),
            groups=groups, nbytes=sum(sizes),
            metrics=batch.meta.get("metrics", {}))

    def _submit_driver_fn(self, node: PlanNode) -> bool:
        if not all(self.outputs[d].done for d in node.deps):
            return False
        sources = self.rt.analysis(self.plan).suppliers[node.name]
        start = time.time()
        inputs = {d: Batch() for d in node.deps}
        for dep in sources:
            shards, fetched = resolve(self.outputs[dep].refs, self.timeout)
            self.result.driver_bytes += fetched
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
            shards, fetched = resolve(refs, self.timeout)
            self.result.driver_bytes += fetched
            out = finish_gather(node, shards, rounds)
            self._put(node, out)
            self._record_node(node, out.meta["metrics"], [])
            return True
        pool, rank = home
        args = TaskArgs()
        for ref in refs:
            args.add(ref)
        task = ShardTask(self.rt.node_id(self.plan, node, pool, rank),
                         group_keys=self.group_keys.get(node.name, ()))
        self.result.driver_bytes += args.value_bytes()
        shard, meta = self.rt.method(pool, rank, "gather", 2).remote(task, rounds, *args.refs)
        self._record(node, pool, rank, meta, 0, args)
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

    def _submit_whole_fn(self, node: PlanNode, home) -> bool:
        """A function over the whole batch (e.g. GAE, whose whitening is batch-wide)
        runs on the worker holding its first input's first shard: the other shards
        travel worker to worker, not through the driver."""
        pool, rank = home
        ref = self._run(node, pool, rank, self._whole_inputs(node), slot=0)
        self.outputs[node.name] = NodeOutput(node.name, [ref], [home], node.name)
        return True

    def _pool_of_first(self, node: PlanNode):
        out = self.outputs.get(node.deps[0]) if node.deps else None
        if out is None or out.homes[0] is None:
            return None
        return out.homes[0]

    def _suppliers(self, node: PlanNode) -> list[NodeOutput]:
        return [self.outputs[d] for d in self.rt.analysis(self.plan).suppliers[node.name]]

    def _slot_inputs(self, node: PlanNode, slots: int):
        return slot_inputs(node, self._suppliers(node), slots)

    def _grouped_inputs(self, node: PlanNode, slots: int):
        return grouped_inputs(node, self._suppliers(node), slots)

    # ---- modes that need the whole input on a rank
    def _submit_whole(self, node: PlanNode) -> bool:
        inputs = self._whole_inputs(node)
        ranks = [0] if node.dispatch == RANK_ZERO else range(self.rt.pool_size(node.pool))
        refs = [self._run(node, node.pool, rank, inputs, slot=0 if rank == 0 else None)
                for rank in ranks]
        self.outputs[node.name] = NodeOutput(node.name, refs[:1], [(node.pool, 0)], node.name)
        return True

    def _whole_inputs(self, node: PlanNode) -> dict:
        return whole_inputs(self._suppliers(node))

    def _submit_generic(self, node: PlanNode) -> bool:
        """A user-defined mode (or one_per_worker): rank 0 runs the mode's dispatch on
        the whole input and its collect on the ranks' results."""
        pool, size = node.pool, self.rt.pool_size(node.pool)
        layout = Layout(size, self.rt.tp_size(self.plan, node.role))
        args, mode = TaskArgs(), get_dispatch_mode(node.dispatch)
        task = self._task(node, self._whole_inputs(node), args, pool, 0)
        task.mode = mode
        self.result.driver_bytes += args.value_bytes()
        *parts, meta = self.rt.method(pool, 0, "scatter", size + 1).remote(
            task, layout, *args.refs)
        self._record(node, pool, 0, meta, None, args)
        self.meta_of.update({part: meta for part in parts})
        raw = []
        for rank, part in enumerate(parts):
            task = ShardTask(self.rt.node_id(self.plan, node, pool, rank), prepared=True,
                             finish=False)
            shard, meta = self.rt.method(pool, rank, "run", 2).remote(task, part)
            self._record(node, pool, rank, meta, None, [part])
            self.meta_of[shard] = meta
            raw.append(shard)
        task = ShardTask(self.rt.node_id(self.plan, node, pool, 0),
                         group_keys=self.group_keys.get(node.name, ()), mode=mode)
        shard, meta = self.rt.method(pool, 0, "collect", 2).remote(task, layout, *raw)
        self._record(node, pool, 0, meta, 0, raw)
        self.meta_of[shard] = meta
        self.outputs[node.name] = NodeOutput(node.name, [shard], [(pool, 0)], node.name)
        return True

    # ---- one worker task
    def _task(self, node: PlanNode, inputs: dict, args: TaskArgs, pool: str,
              rank: int) -> ShardTask:
        specs = {}
        for dep, spec in inputs.items():
            pieces = tuple(Piece(args.add(p.arg), p.rows) for p in spec.pieces)
            specs[dep] = DepInput(pieces, spec.index)
        for dep in node.deps:  # ordering only: a dep whose columns it does not read
            if dep not in inputs:
                for record in self.records.get(dep, []):
                    args.add(record.ref)
        return ShardTask(self.rt.node_id(self.plan, node, pool, rank), specs,
                         group_keys=self.group_keys.get(node.name, ()))

    def _run(self, node: PlanNode, pool: str, rank: int, inputs: dict, slot):
        args = TaskArgs()
        task = self._task(node, inputs, args, pool, rank)
        self.result.driver_bytes += args.value_bytes()
        shard, meta = self.rt.method(pool, rank, "run", 2).remote(task, *args.refs)
        self._record(node, pool, rank, meta, slot, args)
        self.meta_of[shard] = meta
        return shard

    def _record(self, node, pool, rank, meta, slot, args) -> None:
        refs = args.object_refs() if isinstance(args, TaskArgs) else args
        self.tasks.add(node.name, pool, rank, meta, slot, refs)

"""Local runtime: executes an ExecutionPlan in this process.

State (all owned by `LocalRuntime`, changed only by its own methods):
- `ranks[pool]`: one dict per simulated rank, role -> worker instance; the roles of a
  pool share that dict (colocation: the same objects, so weights move in memory).
- during `run_step`, `outputs`: node name -> the Batch it produced this step. Nodes
  run one at a time in the plan's topological order; there is nothing to overlap in
  one process, so there is no ready/running queue.

Ranks of a pool are simulated in turn. Trained roles need a real process group to
stay in sync across ranks, so the local runtime refuses a trained role on more than
one rank; use the Ray runtime for data parallelism.
"""
from __future__ import annotations

import traceback
from typing import Callable

from hybridflow.batch import Batch
from hybridflow.compiler import ExecutionPlan, PlanNode
from hybridflow.config import RuntimeConfig
from hybridflow.deadline import call_with_deadline
from hybridflow.dispatch import SKIP, Layout, get_dispatch_mode
from hybridflow.runtime.common import (
    NodeFailure,
    StepResult,
    assemble_input,
    finish_gather,
    finish_output,
    metrics_of,
    now,
    run_fn_node,
    sum_round_metrics,
    upstream_nodes,
)
from hybridflow.workers.config import read_section

__all__ = ["LocalRuntime"]


def _make_context(rank: int, world_size: int, seed: int, colocated: dict):
    from hybridflow.workers.base import WorkerContext
    return WorkerContext(rank=rank, world_size=world_size, local_rank=rank, device="cpu",
                         seed=seed, colocated=colocated)


class LocalRuntime:
    name = "local"

    def __init__(self, plan: ExecutionPlan, cfg, seed: int = 0,
                 make_context: Callable = _make_context, extra_plans=()):
        """`extra_plans` (e.g. validation) run on the same workers; their roles start too."""
        self.plan, self.cfg, self.make_context = plan, cfg, make_context
        self.ranks: dict[str, list[dict]] = {}
        trained = {n.role for n in plan.nodes if n.kind == "train"}
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

    def _start_rank(self, pool, roles, rank, size, seed) -> dict:
        colocated: dict = {}
        for role in roles:  # construction order = placement order, so ref can see actor
            ctx = self.make_context(rank, size, seed, colocated)
            colocated[role] = self.plan.bindings[role](self.cfg, ctx)
        return colocated

    def workers(self, role: str) -> list:
        pool = self.role_pool[role]
        return [rank[role] for rank in self.ranks[pool]]

    # ------------------------------------------------------------------- step
    def run_step(self, feeds: dict[str, Batch], plan: ExecutionPlan | None = None,
                 draw: Callable[[str], Batch] | None = None) -> StepResult:
        """Run every node once. `feeds` gives each source node's batch; `draw(source)`
        gives more, for gather nodes that need another round."""
        plan = plan or self.plan
        result = StepResult(outputs={})
        for node in plan.nodes:
            start = now()
            if node.op == "gather":
                out = self._gather(node, plan, result, draw)
            else:
                out = self._run_node(node, feeds, result.outputs)
            end = now()
            result.outputs[node.name] = out
            result.rows[node.name] = len(out)
            result.node_metrics[node.name] = metrics_of(out)
            result.metrics.update(result.node_metrics[node.name])
            result.metrics[f"timing_s/{node.name}"] = end - start
            result.timeline.append({"node": node.name, "role": node.role, "pool": node.pool,
                                    "start": start, "end": end})
        return result

    def _gather(self, node: PlanNode, plan: ExecutionPlan, result: StepResult, draw) -> Batch:
        """Re-run the nodes upstream of the gathered one on fresh source batches until
        it has produced `until` rows or `max_rounds` extra rounds were drawn."""
        dep = node.deps[0]
        upstream = upstream_nodes(plan, dep)
        pieces, rounds = [result.outputs[dep]], 0
        history = {n.name: [result.node_metrics[n.name]] for n in upstream}
        while sum(len(p) for p in pieces) < node.kwargs["until"] and draw is not None \
                and rounds < node.kwargs["max_rounds"]:
            feeds = {n.name: draw(n.name) for n in upstream if n.op == "source"}
            outputs: dict[str, Batch] = {}
            for up in upstream:
                outputs[up.name] = self._run_node(up, feeds, outputs)
                history[up.name].append(metrics_of(outputs[up.name]))
            pieces.append(outputs[dep])
            rounds += 1
        for name, rounds_metrics in history.items():  # what the re-runs measured too
            result.node_metrics[name] = sum_round_metrics(rounds_metrics)
            result.metrics.update(result.node_metrics[name])
        return finish_gather(node, pieces, rounds)

    def _run_node(self, node: PlanNode, feeds, outputs) -> Batch:
        if node.op == "source":
            if node.name not in feeds:
                raise ValueError(f"{node.where()}: no batch was fed to this source")
            return finish_output(node, feeds[node.name])
        batch = assemble_input(node, outputs)
        if node.op == "fn":
            try:
                return finish_output(node, self._bounded(node, run_fn_node, node, batch))
            except Exception as err:  # noqa: BLE001 - re-raised with the node named
                raise NodeFailure(node, None, traceback.format_exc()) from err
        return finish_output(node, self._call(node, batch))

    def _call(self, node: PlanNode, batch: Batch):
        workers = self.workers(node.role)
        layout = Layout(len(workers), self.plan.placement.tp_size(node.role))
        mode = get_dispatch_mode(node.dispatch)
        shards = mode.dispatch(batch, layout)
        results = []
        for rank, (worker, shard) in enumerate(zip(workers, shards)):
            if shard is SKIP:
                results.append(None)
                continue
            try:
                method = getattr(worker, node.method)
                results.append(self._bounded(node, method, shard, **node.kwargs))
            except Exception as err:  # noqa: BLE001 - re-raised with node, role and rank
                raise NodeFailure(node, rank, traceback.format_exc()) from err
        return mode.collect(results, layout)

    def _bounded(self, node: PlanNode, fn: Callable, *args, **kwargs):
        """`fn(*args, **kwargs)`, user code, stopped by runtime.call_timeout_s
        (hybridflow/deadline.py: a CallTimeout raised inside it fails the node)."""
        timeout = read_section(self.cfg, "runtime", RuntimeConfig).call_timeout_s
        return call_with_deadline(lambda: fn(*args, **kwargs), timeout, node.where(),
                                  "runtime.call_timeout_s")

    def fetch(self, result: StepResult, node: str, keys) -> Batch:
        """Columns of a node's output, on the driver."""
        return result.outputs[node].select(*keys)

    def call_role(self, role: str, method: str, *args, **kwargs) -> list:
        """Call a method on every rank of a role (checkpointing, weight bytes)."""
        return [getattr(w, method)(*args, **kwargs) for w in self.workers(role)]

    def shutdown(self) -> None:
        self.ranks.clear()

"""Ray runtime: executes an ExecutionPlan on Ray actors, tensors staying on the workers.

State (owned by `RayRuntime`, changed only by its own methods):
- `groups[pool]`: the pool's WorkerGroup: one fused actor per device in rank order
  (rank = node_index * devices_per_node + local index), one STRICT_PACK placement
  group per node, every role colocated on the pool constructed in each actor.
- `settings`: the `runtime` config section, read once.
- `broken`: why the workers can no longer be trusted (an actor died or a call timed
  out), or None. A plain exception inside a method does not break the runtime.
- `_analysis`: per plan, which inputs feed each node and which group-id columns its
  output must report, and each node pickled once; computed once per plan.
- `_taught`: (pool, rank, node digest) for every node a worker was sent
  (`FusedWorker.learn_node`, once per worker and runtime); tasks then name it by digest.
- `_methods`: (pool, rank, method, returns) -> the actor method with its options.
A step's own state lives in `ray_step.StepScheduler` (see there): the driver holds
object references and small metas, never tensors, except for the feeds it sends,
function nodes it runs itself (no `group_by`, not `rows`) and columns it `fetch`es,
all counted in `StepResult.driver_bytes`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import ray

from hybridflow.batch import Batch
from hybridflow.compiler import ExecutionPlan, PlanNode
from hybridflow.dispatch import DP_TP
from hybridflow.runtime.common import NodeFailure, StepResult, input_columns, upstream_nodes
from hybridflow.runtime.ray_pools import (RuntimeSettings, WorkerGroup, connect, launch_group,
                                          start_groups, stop_group)
from hybridflow.runtime.ray_step import NodeOutput, StepScheduler
from hybridflow.runtime.ray_tasks import resolve
from hybridflow.runtime.ray_worker import (ShippedNode, default_context, failure_detail,
                                           payload_bytes)

__all__ = ["RayRuntime", "NodeOutput"]


@dataclass
class PlanAnalysis:
    suppliers: dict[str, list[str]]        # node -> deps it reads at least one column from
    group_keys: dict[str, tuple[str, ...]]  # node -> group-id columns to report per row
    shipped: dict[str, ShippedNode] = field(default_factory=dict)  # pickled once
    upstream: dict[str, ExecutionPlan] = field(default_factory=dict)  # re-run by gathers


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
            if dep is not None and key == node.group_by and node.op == "fn":
                group_keys.setdefault(dep, set()).add(key)
        suppliers[node.name] = [d for d in node.deps if d in deps]
    return PlanAnalysis(suppliers, {k: tuple(sorted(v)) for k, v in group_keys.items()})


class RayRuntime:
    name = "ray"

    def __init__(self, plan: ExecutionPlan, cfg, seed: int = 0,
                 make_context: Callable = default_context, extra_plans=()):
        """`extra_plans` (e.g. validation) run on the same workers; their roles start too."""
        self.plan, self.cfg, self.seed = plan, cfg, seed
        self.settings = RuntimeSettings.from_config(cfg)
        self.broken: str | None = None
        self._analysis: dict[int, tuple[ExecutionPlan, PlanAnalysis]] = {}
        self._taught: set[tuple[str, int, bytes]] = set()
        self._methods: dict[tuple, object] = {}
        self.started_ray = connect(self.settings, plan.placement)
        self.groups: dict[str, WorkerGroup] = {}
        try:
            wanted = {r for p in (plan, *extra_plans) for r in p.roles}
            bindings = {r: c for p in (*extra_plans, plan) for r, c in p.bindings.items()}
            for pool, roles in plan.placement.colocated().items():
                roles = [r for r in roles if r in wanted]
                if roles:
                    self.groups[pool] = launch_group(plan.placement.pools[pool], roles,
                                                     self.settings)
            start_groups(list(self.groups.values()), cfg, bindings, seed, self.settings,
                         make_context)
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------- for the step
    def analysis(self, plan: ExecutionPlan) -> PlanAnalysis:
        if id(plan) not in self._analysis:
            self._analysis[id(plan)] = (plan, analyse(plan))
        return self._analysis[id(plan)][1]

    def shipped(self, plan: ExecutionPlan, node: PlanNode) -> ShippedNode:
        cache = self.analysis(plan).shipped
        if node.name not in cache:
            cache[node.name] = ShippedNode(node)
        return cache[node.name]

    def node_id(self, plan: ExecutionPlan, node: PlanNode, pool: str, rank: int) -> bytes:
        """The digest a task names its node by; the worker is sent the node first
        (Ray runs one caller's tasks to an actor in submission order)."""
        shipped = self.shipped(plan, node)
        key = (pool, rank, shipped.digest)
        if key not in self._taught:
            self.actors(pool)[rank].learn_node.remote(shipped.digest, shipped.blob)
            self._taught.add(key)
        return shipped.digest

    def method(self, pool: str, rank: int, name: str, returns: int):
        """An actor method of rank `rank` with `num_returns=returns`, built once."""
        key = (pool, rank, name, returns)
        if key not in self._methods:
            method = getattr(self.actors(pool)[rank], name)
            self._methods[key] = method.options(num_returns=returns)
        return self._methods[key]

    def upstream_plan(self, plan: ExecutionPlan, name: str) -> ExecutionPlan:
        """The part of `plan` a gather node re-runs: `name` and what it depends on."""
        cache = self.analysis(plan).upstream
        if name not in cache:
            nodes = upstream_nodes(plan, name)
            cache[name] = ExecutionPlan(plan.graph_name, nodes, plan.placement, plan.bindings,
                                        [[n.name] for n in nodes])
        return cache[name]

    def actors(self, pool: str) -> list:
        return self.groups[pool].actors

    def pool_size(self, pool: str) -> int:
        return self.groups[pool].size

    def tp_size(self, plan: ExecutionPlan, role: str) -> int:
        return plan.placement.tp_size(role)

    def home_slots(self, plan: ExecutionPlan, name: str) -> list:
        """Where a batch put by the driver goes: split for its first consumer call."""
        for node in plan.nodes:
            if name in node.deps and node.op == "call" and node.pool in self.groups:
                size = self.pool_size(node.pool)
                tp = self.tp_size(plan, node.role) if node.dispatch == DP_TP else 1
                return [(node.pool, s * tp) for s in range(size // tp)]
        pool = next(iter(self.groups), None)
        return [(pool, r) for r in range(self.pool_size(pool))] if pool else []

    # ------------------------------------------------------------------- API
    def run_step(self, feeds: dict[str, Batch], plan: ExecutionPlan | None = None,
                 draw: Callable[[str], Batch] | None = None) -> StepResult:
        """Run every node once; outputs stay on the workers as NodeOutput handles.
        `draw(source)` gives more batches, for gather nodes that need another round."""
        plan = plan or self.plan
        if self.broken:
            raise RuntimeError(f"the Ray runtime cannot run another step: {self.broken}; "
                               f"shut it down and start a new one")
        self._check_roles(plan)
        start = time.perf_counter()
        scheduler = StepScheduler(self, plan, feeds, draw)
        result = scheduler.run()
        result.metrics["runtime/driver_busy_s"] = scheduler.busy_s
        result.metrics["runtime/step_s"] = time.perf_counter() - start
        return result

    def _check_roles(self, plan: ExecutionPlan) -> None:
        for node in plan.nodes:
            if node.op != "call":
                continue
            group = self.groups.get(node.pool)
            if group is None or node.role not in group.roles:
                running = {p: g.roles for p, g in self.groups.items()}
                raise ValueError(f"{node.where()}: role '{node.role}' on pool '{node.pool}' "
                                 f"is not running in this runtime (running: {running})")

    def fetch(self, result: StepResult, node: str, keys) -> Batch:
        """Only `keys` of a node's output, on the driver (counted in driver_bytes)."""
        out: NodeOutput = result.outputs[node]
        keys = tuple(keys)
        missing = [k for k in keys if k not in (out.keys or [])]
        if missing:
            raise KeyError(f"node '{node}' output has no key(s) {missing}; it has "
                           f"{sorted(out.keys or [])}")
        refs = []
        for ref, home in zip(out.refs, out.homes):
            if out.on_driver or home is None:
                refs.append(ref)
            else:
                refs.append(self.actors(home[0])[home[1]].select.remote(keys, ref))
        try:
            shards, _ = resolve(refs, self.settings.call_timeout_s)
        except ray.exceptions.RayError as err:
            raise NodeFailure(PlanNode(node, "call", "call", (), "fetch"), None,
                              failure_detail(err)) from None
        shards = [s.select(*keys) for s in shards]
        batch = shards[0] if len(shards) == 1 else Batch.concat(shards)
        batch.meta = {**batch.meta, "metrics": dict(out.metrics)}
        result.driver_bytes += sum(payload_bytes(s) for s, r in zip(shards, refs)
                                   if isinstance(r, ray.ObjectRef))  # by-value: here already
        return batch

    def call_role(self, role: str, method: str, *args, **kwargs) -> list:
        """`method(*args, **kwargs)` on every rank of a role (checkpoints, weight bytes)."""
        pool = self.plan.placement.roles.get(role)
        if pool not in self.groups or role not in self.groups[pool].roles:
            raise ValueError(f"role '{role}' is not running in this runtime")
        refs = [a.call.remote(role, method, args, kwargs) for a in self.actors(pool)]
        node = PlanNode(f"{role}.{method}", "call", "call", (), "call_role", role=role,
                        method=method, pool=pool)
        deadline, values = time.time() + self.settings.call_timeout_s, []
        for rank, ref in enumerate(refs):
            try:
                values.append(ray.get(ref, timeout=max(0.0, deadline - time.time())))
            except ray.exceptions.GetTimeoutError:
                raise NodeFailure(node, rank, f"no result within runtime.call_timeout_s="
                                              f"{self.settings.call_timeout_s:g}s") from None
            except ray.exceptions.RayError as err:
                raise NodeFailure(node, rank, failure_detail(err)) from None
        return values

    def worker_info(self, pool: str) -> list[dict]:
        """Per rank: node id, ip, pid, GPU ids, roles and the torch.distributed env."""
        return ray.get([a.info.remote() for a in self.actors(pool)],
                       timeout=self.settings.call_timeout_s)

    def output_bytes(self, result: StepResult) -> int:
        """Bytes of every node output of a step, as the workers measured them."""
        return sum(o.nbytes for o in result.outputs.values())

    def shutdown(self) -> None:
        for group in self.groups.values():
            stop_group(group)
        self.groups.clear()
        self._taught.clear()
        self._methods.clear()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
        self.started_ray = False

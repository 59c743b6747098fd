"""Ray runtime: executes an ExecutionPlan on Ray actors, tensors staying on the workers.

State (owned by `RayRuntime`, changed only by its own methods):
- `groups[pool]`: the pool's WorkerGroup: one fused actor per device in rank order
  (rank = node_index * devices_per_node + local index), one STRICT_PACK placement
  group per node, every role colocated on the pool constructed in each actor.
- `settings`: the `runtime` config section, read once.
- `broken`: why the workers can no longer be trusted (an actor died or a call timed
  out), or None. A plain exception inside a method does not break the runtime.
- `plans`: per plan (`executor.PlanCache`), which inputs feed each node, which
  group-id columns its output must report, and each node pickled once.
- `_taught`: (pool, rank, node digest) for every node a worker was sent
  (`FusedWorker.learn_node`, once per worker and runtime); tasks then name it by digest.
- `_methods`: (pool, rank, method, returns) -> the actor method with its options.
- `_put_sizes`: id -> (batch, `payload_bytes`) of the batches `put` this step, held
  so their ids stay theirs; cleared when the step ends.

The runtime is an *executor*: a step's semantics and state live in
`scheduler.StepScheduler`; this module submits the tasks it decides, tracks them
(`runtime/ray/tasks.py` `InFlight`: the hang clock, failures) and says what crossing the driver
costs. The driver holds object references and small metas, never tensors, except
for the feeds it sends, stateful function nodes it runs itself and columns it
`fetch`es, all counted in `StepResult.driver_bytes`. A streaming rollout's samples
stay on its workers too (runtime/run_long/stream_client.py): the driver sends prompts to the
rank that generates them and receives per-group numbers; those bytes are counted.
"""
from __future__ import annotations

import pickle
import time
from typing import Callable

import ray

from hybridflow.core.batch import Batch
from hybridflow.core.modes import RuntimeName
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.runtime.common import NodeFailure, StepResult
from hybridflow.runtime.outputs import NodeOutput
from hybridflow.runtime.ray.pools import (RuntimeSettings, WorkerGroup, connect, launch_group,
                                          start_groups, stop_group)
from hybridflow.runtime.ray.tasks import InFlight, resolve
from hybridflow.runtime.worker_shell import (ShippedNode, default_context, encode_task,
                                             failure_cause, failure_detail, payload_bytes)
from hybridflow.runtime.executor import PlanCache
from hybridflow.runtime.scheduler import run_step

__all__ = ["RayRuntime", "NodeOutput", "INLINE_BYTES"]

INLINE_BYTES = 64 * 1024  # driver-held shards up to this size travel inside the tasks
PUT_SIZES = 4096  # batches whose size `put` keeps (cleared after every step)


class RayRuntime:
    name = RuntimeName.RAY

    def __init__(self, plan: ExecutionPlan, cfg, seed: int = 0,
                 make_context: Callable = default_context, extra_plans=()):
        """`extra_plans` (e.g. validation) run on the same workers; their roles start too."""
        self.plan, self.cfg, self.seed = plan, cfg, seed
        self.settings = RuntimeSettings.from_config(cfg)
        self.broken: str | None = None
        self.plans = PlanCache()
        self._taught: set[tuple[str, int, bytes]] = set()
        self._methods: dict[tuple, object] = {}
        self._put_sizes: dict[int, tuple[Batch, int]] = {}
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
                         make_context, {r: plan.placement.tp_size(r) for r in wanted})
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------- executor (scheduler.Executor)
    @property
    def call_timeout_s(self) -> float:
        return self.settings.call_timeout_s

    def pool_size(self, pool: str) -> int:
        return self.groups[pool].size

    def roles_on(self, pool: str) -> list[str]:
        group = self.groups.get(pool)
        return list(group.roles) if group is not None else []

    def node_id(self, plan: ExecutionPlan, node: PlanNode, pool: str, rank: int) -> bytes:
        """The digest a task names its node by; the worker is sent the node first
        (Ray runs one caller's tasks to an actor in submission order)."""
        cache = self.plans.analysis(plan).node_ids
        if node.name not in cache:
            cache[node.name] = ShippedNode(node)  # pickled once per plan
        shipped = cache[node.name]
        key = (pool, rank, shipped.digest)
        if key not in self._taught:
            self.actors(pool)[rank].learn_node.remote(shipped.digest, shipped.blob)
            self._taught.add(key)
        return shipped.digest

    def submit(self, node: PlanNode, method: str, pool: str, rank: int, returns: int,
               task, args: list) -> list:
        """The task travels as bytes (`encode_task`): Ray sends them as they are."""
        return self._method(pool, rank, method, returns).remote(encode_task(task), *args)

    def _method(self, pool: str, rank: int, name: str, returns: int):
        """An actor method of rank `rank` with `num_returns=returns`, built once."""
        key = (pool, rank, name, returns)
        if key not in self._methods:
            method = getattr(self.actors(pool)[rank], name)
            self._methods[key] = method.options(num_returns=returns)
        return self._methods[key]

    def put(self, batch: Batch):
        """A small batch travels inside each task that reads it (counted then), as a
        plain Ray user passes small arguments; a larger one goes into the object store
        once (counted here). Its size is worked out once a step (`_put_sizes`): the
        scheduler and every task that reads it ask again."""
        size = payload_bytes(batch)
        if len(self._put_sizes) >= PUT_SIZES:
            self._put_sizes.clear()
        self._put_sizes[id(batch)] = (batch, size)
        return (batch, 0) if size <= INLINE_BYTES else (ray.put(batch), size)

    def resolve(self, handles: list) -> tuple[list, int]:
        return resolve(handles, self.settings.call_timeout_s)

    def is_ref(self, handle) -> bool:
        return isinstance(handle, ray.ObjectRef)

    def value_bytes(self, value) -> int:
        """What `value` costs to cross a process: a batch's payload, an array's
        buffer, anything else its pickle (a poll reply, a list of uids)."""
        if isinstance(value, Batch):
            known = self._put_sizes.get(id(value))
            return known[1] if known is not None and known[0] is value else \
                payload_bytes(value)
        nbytes = getattr(value, "nbytes", None)
        return int(nbytes) if nbytes is not None else len(pickle.dumps(value, protocol=5))

    def tracker(self, plan: ExecutionPlan) -> InFlight:
        return InFlight(self, plan)

    def actors(self, pool: str) -> list:
        return self.groups[pool].actors

    # ------------------------------------------------------------------- API
    def run_step(self, feeds: dict[str, Batch], plan: ExecutionPlan | None = None,
                 draw: Callable[[str], Batch] | None = None,
                 skip: frozenset = frozenset()) -> StepResult:
        """Run every node not in `skip` once; outputs stay on the workers as NodeOutput
        handles. `draw(source)` gives more batches, for gather nodes that need another
        round."""
        try:
            return run_step(self, plan or self.plan, feeds, draw, skip)
        finally:
            self._put_sizes.clear()  # the step's batches go; their ids may be reused

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
            raise NodeFailure(PlanNode(node, NodeKind.INFERENCE, Op.CALL, (), "fetch"), None,
                              failure_detail(err), cause=failure_cause(err)) from None
        shards = [s.select(*keys) for s in shards]
        batch = shards[0] if len(shards) == 1 else Batch.concat(shards)
        batch.meta = {**batch.meta, "metrics": dict(out.metrics)}
        result.driver_bytes += sum(payload_bytes(s) for s, r in zip(shards, refs)
                                   if isinstance(r, ray.ObjectRef))  # by-value: here already
        return batch

    def call_role(self, role: str, method: str, *args, **kwargs) -> list:
        """`method(*args, **kwargs)` on every rank of a role (checkpoints, weight bytes)."""
        pool = self.plan.placement.roles.get(role)
        size = self.groups[pool].size if pool in self.groups else 0
        return self.call_each(role, method, [args] * size, **kwargs)

    def call_each(self, role: str, method: str, args_by_rank: list, **kwargs) -> list:
        """`method(*args_by_rank[r], **kwargs)` on each rank r of a role, at once (None:
        rank r is not called and its reply is None); bounded by runtime.call_timeout_s."""
        pool = self.plan.placement.roles.get(role)
        if pool not in self.groups or role not in self.groups[pool].roles:
            raise ValueError(f"role '{role}' is not running in this runtime")
        refs = [None if a is None else actor.call.remote(role, method, tuple(a), kwargs)
                for actor, a in zip(self.actors(pool), args_by_rank)]
        node = PlanNode(f"{role}.{method}", NodeKind.INFERENCE, Op.CALL, (), "call_role",
                        role=role, method=method, pool=pool)
        deadline, values = time.time() + self.settings.call_timeout_s, []
        for rank, ref in enumerate(refs):
            if ref is None:
                values.append(None)
                continue
            try:
                values.append(ray.get(ref, timeout=max(0.0, deadline - time.time())))
            except ray.exceptions.GetTimeoutError:
                raise NodeFailure(node, rank, f"no result within runtime.call_timeout_s="
                                              f"{self.settings.call_timeout_s:g}s") from None
            except ray.exceptions.RayError as err:
                raise NodeFailure(node, rank, failure_detail(err),
                                  cause=failure_cause(err)) from None
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
        self.plans.clear()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
        self.started_ray = False

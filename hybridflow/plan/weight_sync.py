"""The weight-sync edge: when a role generates with weights of its own (the
`rollout` role on another pool than the actor), the compiled plan gets two nodes
after the actor's training node(s):

    actor.update -> weight_export (actor.export_weights, every actor rank; rank 0's kept)
                 -> weight_sync   (rollout.load_weights, every rollout rank)

They are ordinary call nodes, so every runtime runs, times (`timing_s/weight_sync`)
and draws them like any other. The export is a small object: the weights' index and
where their buckets are (`hybridflow/workers/rollout/weights.py`; on Ray one object
reference per bucket, put by the actor's rank 0 while every rank gathers), so the
weights move worker to worker in bounded buckets, never through the driver and
never as one whole-model buffer. When
the two roles share a pool they share a process and a module: no node is added.

Which role syncs from which is declared by the worker class: a class attribute
`HOST_ROLE = "actor"` plus a `load_weights` method, and the host's class exports
with `export_weights` (see `hybridflow/workers/rollout/worker.py`).

This module imports nothing from the compiler (the compiler calls it): it builds
the new plan nodes with `dataclasses.replace` of an existing call node.
"""
from __future__ import annotations

from dataclasses import replace

from hybridflow.graph.dispatch import worker_methods
from hybridflow.core.kinds import Op
from hybridflow.core.worker_hooks import host_role

__all__ = ["insert_weight_sync", "resync_plan", "sync_pairs", "weights_host", "planner_view",
           "EXPORT_NODE", "SYNC_NODE"]

EXPORT_NODE, SYNC_NODE = "weight_export", "weight_sync"
EXPORT_METHOD, LOAD_METHOD = "export_weights", "load_weights"


def weights_host(cls) -> str | None:
    """The role whose weights a worker class generates with (colocated) or loads
    (apart): its `HOST_ROLE` when it declares a `load_weights` method, else None."""
    host = host_role(cls)
    return host if host is not None and LOAD_METHOD in worker_methods(cls) else None


def sync_pairs(plan) -> list[tuple[str, str]]:
    """(role, host) for each role of `plan` that holds its own copy of a host role's
    weights (placed on another pool) while the plan trains the host."""
    roles, pairs = plan.placement.roles, []
    trained = {n.role for n in plan.nodes if n.kind.trains}
    for role in plan.roles:
        host = weights_host(plan.bindings[role])
        if host is not None and host in trained and roles.get(role) != roles.get(host):
            pairs.append((role, host))
    return pairs


def _call_node(template, name: str, role: str, method: str, spec, pool: str, deps,
               location: str, input_keys: dict):
    return replace(template, name=name, kind=spec.kind, op="call", deps=tuple(deps),
                   location=location, role=role, method=method, pool=pool,
                   dispatch=spec.dispatch, reads=spec.reads, optional=(),
                   writes=spec.writes, kwargs={}, fn=None, group_by=None, rows=False,
                   forwards=False, rename={}, input_keys=dict(input_keys),
                   output_keys={k: name for k in spec.writes})


def _unique(name: str, taken: set[str]) -> str:
    out, i = name, 2
    while out in taken:
        out, i = f"{name}#{i}", i + 1
    return out


def insert_weight_sync(plan):
    """`plan` with the weight-sync nodes added (the same plan when none is needed)."""
    pairs = sync_pairs(plan)
    if not pairs:
        return plan
    nodes, stages = list(plan.nodes), [list(s) for s in plan.stages]
    taken = {n.name for n in nodes}
    template = next(n for n in nodes if n.op == Op.CALL)
    for role, host in pairs:
        exports = worker_methods(plan.bindings[host])
        if EXPORT_METHOD not in exports:
            raise ValueError(
                f"role '{role}' is placed on pool '{plan.placement.roles[role]}', away from "
                f"role '{host}' (pool '{plan.placement.roles[host]}'), so it needs the "
                f"weights of '{host}' after each update, but {plan.bindings[host].__name__} "
                f"has no @method {EXPORT_METHOD}; place both roles on one pool")
        trains = [n.name for n in nodes if n.role == host and n.kind.trains]
        where = (f"inserted by hybridflow/plan/weight_sync.py: '{role}' holds its own weights "
                 f"on pool '{plan.placement.roles[role]}'")
        export = _call_node(template, _unique(EXPORT_NODE, taken), host, EXPORT_METHOD,
                            exports[EXPORT_METHOD], plan.placement.roles[host], trains, where,
                            {})
        taken.add(export.name)
        spec = worker_methods(plan.bindings[role])[LOAD_METHOD]
        load = _call_node(template, _unique(SYNC_NODE, taken), role, LOAD_METHOD, spec,
                          plan.placement.roles[role], [export.name], where,
                          {k: export.name for k in spec.reads})
        taken.add(load.name)
        nodes += [export, load]
        stages += [[export.name], [load.name]]
    return replace(plan, nodes=nodes, stages=stages)


def resync_plan(plan):
    """The weight-sync nodes of `plan` alone, without their dependency on this step's
    update: run once after a resume, so a rollout holding its own weights starts from
    the restored actor's weights (None when `plan` has no weight sync)."""
    loads = [n for n in plan.nodes if n.op == Op.CALL and n.method == LOAD_METHOD
             and n.deps and plan.node(n.deps[0]).method == EXPORT_METHOD]
    if not loads:
        return None
    nodes, stages = [], []
    for load in loads:
        export = replace(plan.node(load.deps[0]), deps=())
        nodes += [export, load]
        stages += [[export.name], [load.name]]
    return replace(plan, graph_name=f"{plan.graph_name}:weight_sync", nodes=nodes,
                   stages=stages, warnings=[])


def planner_view(plan):
    """`plan` as the placement planner should see it: a role colocated with the role
    whose weights it generates with (a folded rollout) is that role, since it holds no
    model of its own; the planner's cost model knows generation as the actor's."""
    folded = getattr(getattr(plan, "placement", None), "folded", {})  # any graph view
    bindings = getattr(plan, "bindings", {})
    # every folded role: served by its host's worker, it holds no model of its own and
    # cannot be placed apart from it (an agent rollout, issue 26), like a rollout
    merged = {role: host for role, host in folded.items() if role in bindings}
    if not merged:
        return plan
    nodes = [replace(n, role=merged.get(n.role, n.role)) for n in plan.nodes]
    return replace(plan, nodes=nodes)

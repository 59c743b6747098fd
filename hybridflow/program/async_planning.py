"""What the placement planner gets from a compiled plan, synchronous or async.

With `trainer.staleness = 0` that is `weight_sync.planner_view(plan)`: a rollout
folded into the actor is planned as the actor. With `staleness >= 1` the planner
also decides where the rollout runs, so every rollout role that samples with a
trained role's weights is folded into that host whatever the config placed (the
weight-sync nodes the compiler added for a rollout apart are dropped), and a
`planner.Pipeline` says which nodes run ahead of training (the compiler's
`async_split.split_sides`; with `trainer.async_mode=streaming` the stream side of
`streaming_split.streaming_sides`, and `Pipeline.streaming`) and which generate nodes
may move to a pool of their own (the planner then adds the sync it costs). A plan
the planner picks with the rollout apart places role `rollout` on its own pool; the
compiler then inserts the real weight-sync nodes.

Stateless: one function of the compiled plan.
"""
from __future__ import annotations

from dataclasses import replace

from hybridflow.plan.async_split import (sides_of, split_sides, staleness_of, trained_roles,
                                         without_buffers)
from hybridflow.plan.streaming_split import is_streaming, streaming_sides
from hybridflow.core.modes import AsyncMode, StreamSide, run_modes
from hybridflow.plan.weight_sync import EXPORT_METHOD, LOAD_METHOD, planner_view, weights_host

__all__ = ["pipeline_view"]


def pipeline_view(plan, staleness: int | None = None, mode: AsyncMode | str | None = None,
                  stream_side: StreamSide | str = StreamSide.AUTO):
    """(the graph view the planner plans, its `Pipeline` or None when synchronous).

    `staleness` None: the plan's own (its buffers' capacity, set by `program.prepare`);
    `mode` None: the plan's own (`streaming` when its buffer streams, its stream side
    read from its buffers), else `trainer.async_mode` with `stream_side`
    (`trainer.stream_side`): members or the config's strings, which `run_modes`
    converts."""
    from hybridflow.planner import Pipeline

    buffered = staleness_of(plan)
    staleness = buffered if staleness is None else staleness
    given = run_modes({"trainer": {"async_mode": mode, "stream_side": stream_side}})
    streaming = is_streaming(plan) if mode is None else given.async_mode.streams
    own = sides_of(plan) if mode is None and streaming else None
    plan = without_buffers(plan)  # the planner costs the graph's nodes, not the hand-off
    if staleness < 1:
        return planner_view(plan), None
    # streaming: the source, the generate node and the nodes the compiler moves there
    # (plan/streaming_split.py)
    sides = own or (streaming_sides(plan, staleness, stream_side=given.stream_side)
                    if streaming else split_sides(plan, staleness))
    view, movable = _rollouts_folded(plan)
    names = {n.name for n in view.nodes}
    return view, Pipeline(staleness, frozenset(n for n in sides.rollout if n in names), movable,
                          streaming)


def _rollouts_folded(plan):
    """`plan` with each rollout role's nodes given to its host and the weight-sync nodes
    dropped; and {generate node: rollout role} of the nodes that may move back apart."""
    trained = trained_roles(plan)
    hosts = {}
    for role in plan.roles:
        host = weights_host(plan.bindings[role]) if role in plan.bindings else None
        if host is not None and host in trained and host != role:
            hosts[role] = host
    # a folded role that cannot hold weights of its own (an agent rollout) stays its
    # host's, never movable apart
    fixed = {r: h for r, h in plan.placement.folded.items() if r not in hosts}
    if not hosts:
        return planner_view(plan), {}
    sync_methods = (EXPORT_METHOD, LOAD_METHOD)
    dropped = {n.name for n in plan.nodes
               if n.method in sync_methods and (n.role in hosts or n.role in hosts.values())}
    nodes, movable = [], {}
    for node in plan.nodes:
        if node.name in dropped:
            continue
        if node.role in hosts:
            if node.kind.generates:
                movable[node.name] = node.role
            node = replace(node, role=hosts[node.role])
        elif node.role in fixed:
            node = replace(node, role=fixed[node.role])
        nodes.append(replace(node, deps=tuple(d for d in node.deps if d not in dropped)))
    return replace(plan, nodes=nodes), movable

"""Dispatch modes registered as a (dispatch, collect) pair (deprecated): they declare
no slot layout, so the step scheduler funnels them through rank 0. Slot layouts
(`dispatch.register_dispatch_mode(name, slots=...)`) replace them."""
from __future__ import annotations

from hybridflow.plan.compiler import PlanNode
from hybridflow.graph.dispatch import DispatchMode, Layout
from hybridflow.runtime.executor import TaskArgs
from hybridflow.runtime.outputs import NodeOutput
from hybridflow.runtime.worker_shell import ShardTask

__all__ = ["submit_funnel"]


def submit_funnel(sched, node: PlanNode, mode: DispatchMode, layout: Layout) -> bool:
    """A mode registered as a (dispatch, collect) pair (deprecated): rank 0 runs
    the mode's dispatch on the whole input and its collect on the ranks' results."""
    pool, size = node.pool, layout.world_size
    args = TaskArgs(sched.ex)
    task = sched._task(node, sched._whole_inputs(node), args, pool, 0)
    task.mode = mode
    *parts, meta = sched._submit_raw(node, "scatter", pool, 0, size + 1, task, args,
                                    extra=(layout,))
    sched._record(node, pool, 0, meta, None, args.object_refs())
    sched.meta_of.update({part: meta for part in parts})
    raw = []
    for rank, part in enumerate(parts):
        task = ShardTask(sched.ex.node_id(sched.plan, node, pool, rank), prepared=True,
                         finish=False)
        part_args = TaskArgs(sched.ex)
        part_args.add(part)
        raw.append(sched._submit(node, "run", pool, rank, task, part_args, None))
    task = ShardTask(sched.ex.node_id(sched.plan, node, pool, 0),
                     group_keys=sched.group_keys.get(node.name, ()), mode=mode)
    collect_args = TaskArgs(sched.ex)
    for shard in raw:
        collect_args.add(shard)
    shard = sched._submit(node, "collect", pool, 0, task, collect_args, 0, extra=(layout,))
    sched.outputs[node.name] = NodeOutput(node.name, [shard], [(pool, 0)], node.name)
    return True

"""A gather node's rounds, for the step scheduler (`scheduler.StepScheduler`): the
nodes upstream of the gathered one re-run as sub-steps on fresh draws until enough
rows exist. It changes only the scheduler state it is handed (outputs, result)."""
from __future__ import annotations

from hybridflow.plan.compiler import PlanNode
from hybridflow.core.kinds import Op
from hybridflow.runtime.common import finish_gather, sum_round_metrics
from hybridflow.runtime.executor import TaskArgs
from hybridflow.runtime.outputs import NodeOutput
from hybridflow.runtime.progress import no_rows_kept
from hybridflow.runtime.worker_shell import ShardTask

__all__ = ["submit_gather"]


def submit_gather(sched, node: PlanNode) -> bool:
    """Re-run the nodes upstream of the gathered one on fresh source batches (one
    sub-step a round) until it has `until` rows or `max_rounds` extra rounds ran;
    then the first `until` rows, concatenated on the worker holding the first. No row
    kept after the last round stops the run (progress.py): nothing could train."""
    dep = node.deps[0]
    if not sched.outputs[dep].done:
        return False
    until, max_rounds = node.kwargs["until"], node.kwargs["max_rounds"]
    upstream = sched.ex.plans.upstream_plan(sched.plan, dep)
    pieces, rounds = [sched.outputs[dep]], 0
    feeder = sched.plan.node(dep).deps[0] if sched.plan.node(dep).deps else None
    seen = _rows(sched.outputs.get(feeder))
    history = {n.name: [sched.result.node_metrics.get(n.name, {})] for n in upstream.nodes}
    while sum(p.num_rows for p in pieces) < until and sched.draw is not None \
            and rounds < max_rounds:
        feeds = {n.name: sched.draw(n.name) for n in upstream.nodes if n.op is Op.SOURCE}
        sub = type(sched)(sched.ex, upstream, feeds).run()
        pieces.append(sub.outputs[dep])
        seen += sub.rows.get(feeder, 0) if feeder else 0
        sched.result.driver_bytes += sub.driver_bytes
        sched.result.timeline += sub.timeline
        for name, metrics in sub.node_metrics.items():
            history[name].append(metrics)
        rounds += 1
    for name, metrics in history.items():
        sched.result.node_metrics[name] = sum_round_metrics(metrics)
    if not sum(p.num_rows or 0 for p in pieces):
        raise no_rows_kept(None, sched.plan.node(dep).where(), seen, seen, rounds + 1,
                           max_rounds, "rows", node.name)
    refs = [ref for p in pieces for ref in p.refs]
    home = pieces[0].homes[0]
    if home is None:  # the gathered node ran on the driver
        shards, fetched = sched.ex.resolve(refs)
        sched.result.driver_bytes += fetched
        out = finish_gather(node, shards, rounds)
        sched._put(node, out)
        sched._record_node(node, out.meta["metrics"], [], [])
        return True
    pool, rank = home
    args = TaskArgs(sched.ex)
    for ref in refs:
        args.add(ref)
    task = ShardTask(sched.ex.node_id(sched.plan, node, pool, rank),
                     group_keys=sched.group_keys.get(node.name, ()))
    shard = sched._submit(node, "gather", pool, rank, task, args, 0, extra=(rounds,))
    sched.outputs[node.name] = NodeOutput(node.name, [shard], [home], node.name)
    return True


def _rows(output) -> int:
    return (output.num_rows or 0) if output is not None and output.done else 0

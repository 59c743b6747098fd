"""A gather node's rounds, for the step scheduler (`scheduler.StepScheduler`): the
nodes upstream of the gathered one re-run as sub-steps on fresh draws until enough
rows exist, within the gather's `DrawBound` (draw_bound.py: DAPO's, shared with the
streaming entrance). It uses the scheduler's public surface only (`sub_pass`,
`put_output`, `submit_task`, `set_output`) and adds to its `result`."""
from __future__ import annotations

from hybridflow.plan.compiler import PlanNode
from hybridflow.core.kinds import Op
from hybridflow.runtime.common import finish_gather, sum_round_metrics
from hybridflow.runtime.draw_bound import DrawBound
from hybridflow.runtime.executor import TaskArgs

__all__ = ["submit_gather"]


def submit_gather(sched, node: PlanNode) -> bool:
    """Re-run the nodes upstream of the gathered one on fresh source batches (one
    sub-step a round) until it has `until` rows or its bound's extra rounds ran;
    then the first `until` rows, concatenated on the worker holding the first. No row
    kept after the last round stops the run (progress.py): nothing could train."""
    dep = node.deps[0]
    if not sched.outputs[dep].done:
        return False
    until, bound = node.kwargs["until"], DrawBound.of(node)
    upstream = sched.ex.plans.upstream_plan(sched.plan, dep)
    pieces, rounds = [sched.outputs[dep]], 0
    feeder = sched.plan.node(dep).deps[0] if sched.plan.node(dep).deps else None
    seen = _rows(sched.outputs.get(feeder))
    history = {n.name: [sched.result.node_metrics.get(n.name, {})] for n in upstream.nodes}
    while sum(p.num_rows for p in pieces) < until and sched.draw is not None \
            and bound.may_draw(rounds):
        feeds = {n.name: sched.draw(n.name) for n in upstream.nodes if n.op is Op.SOURCE}
        sub = sched.sub_pass(upstream, feeds)
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
        raise bound.no_progress(None, sched.plan.node(dep).where(), seen, seen, rounds + 1,
                                "rows", node.name)
    refs = [ref for p in pieces for ref in p.refs]
    home = pieces[0].homes[0]
    if home is None:  # the gathered node ran on the driver
        shards, fetched = sched.ex.resolve(refs)
        sched.result.driver_bytes += fetched
        sched.put_output(node, finish_gather(node, shards, rounds))
        return True
    pool, rank = home
    args = TaskArgs(sched.ex)
    for ref in refs:
        args.add(ref)
    shard = sched.submit_task(node, "gather", pool, rank, args, 0, extra=(rounds,))
    sched.set_output(node, [shard], [home])
    return True


def _rows(output) -> int:
    return (output.num_rows or 0) if output is not None and output.done else 0

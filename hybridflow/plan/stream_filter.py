"""A gather in a streaming plan (`trainer.async_mode=streaming`): DAPO's dynamic
sampling as a filter at the buffer's entrance.

In the pipelined mode a gather re-draws within a step until it holds `until` rows
that its input (e.g. `drop_uniform_groups`) kept. Streaming draws continuously
anyway, so the gather becomes the buffer's entrance instead:

- the **entrance nodes**: the nodes between the generate node and the gather (its
  input and what that reads: the rule reward, the overlong penalty, the filter). They
  join the stream side and run on each whole group as it completes, in an *entrance
  pass* (`entrance_plan`: the generate node's rows fed through a buffer node of their
  own, everything else skipped);
- a group the filter drops is rejected at the entrance: counted, its prompt consumed
  (never drawn again, also after a resume), more prompts drawn in its place; a group
  it keeps enters the streaming buffer, which sits at the gather (`buffer/<gather>`),
  with the columns the filter's output carries;
- a step takes `until / n` kept groups (the gather's rows, in groups of the generate
  node's `n`); `max_rounds` bounds the wait as DAPO bounds its extra draws: a step
  that saw more than `max_rounds` batches' worth of groups rejected while it waited
  trains the kept groups it holds (runtime/run_long/stream_source.py).

Refused, naming the node: more than one gather; a gather not fed by the generate node
(through entrance nodes), or whose input does not forward the samples' columns;
`until` not a whole number of groups of an explicit `n`; a train-side node reading
the generate node or an entrance node instead of the gather.
Stateless: functions of a plan.
"""
from __future__ import annotations

from dataclasses import replace

from hybridflow.core.kinds import NodeKind, Op
from hybridflow.core.modes import AsyncMode
from hybridflow.plan.async_split import BUFFER_PREFIX, PROMPT_UNIT, BufferSpec
from hybridflow.plan.compiler import ExecutionPlan, PlanNode, plan_stages

__all__ = ["stream_gather", "entrance_names", "filter_problems", "entrance_plan",
           "groups_per_step"]



def stream_gather(plan: ExecutionPlan) -> PlanNode | None:
    """The plan's one gather (None without)."""
    return next((n for n in plan.nodes if n.op is Op.GATHER), None)


def entrance_names(plan: ExecutionPlan, gen: PlanNode, gather: PlanNode) -> list[str]:
    """The nodes between the generate node and the gather, in plan order."""
    wanted, stack = set(), list(gather.deps)
    while stack:
        name = stack.pop()
        node = plan.node(name)
        if name in wanted or name == gen.name or node.op is Op.SOURCE:
            continue
        wanted.add(name)
        stack.extend(node.deps)
    return [n.name for n in plan.nodes if n.name in wanted]


def _descends(plan: ExecutionPlan, name: str, gen: str) -> bool:
    node = plan.node(name)
    return name == gen or any(_descends(plan, d, gen) for d in node.deps)


def filter_problems(plan: ExecutionPlan, gen: PlanNode, gathers: list[PlanNode]) -> list[str]:
    """What streaming refuses of the plan's gathers (none: no problem)."""
    if not gathers:
        return []
    if len(gathers) > 1:
        return [f"{g.where()}: trainer.async_mode=streaming filters at one buffer's "
                f"entrance, but the graph has {len(gathers)} gathers "
                f"({[n.name for n in gathers]}); set trainer.async_mode=pipeline"
                for g in gathers[1:]]
    gather, problems = gathers[0], []
    if not _descends(plan, gather.deps[0], gen.name):
        problems.append(f"{gather.where()}: streaming filters the samples of "
                        f"'{gen.name}' at the buffer's entrance, but this gather's input "
                        f"'{gather.deps[0]}' does not read it; set "
                        f"trainer.async_mode=pipeline")
    source = plan.node(gather.deps[0])
    if source.name != gen.name and not source.forwards:
        problems.append(f"{gather.where()}: the rows entering the streaming buffer are "
                        f"the gather input's, but '{source.name}' does not forward the "
                        f"samples' columns (declare it forwards=True, as "
                        f"drop_uniform_groups does)")
    n, until = gen.kwargs.get("n"), gather.kwargs.get("until")
    if not isinstance(n, int) or n < 1 or until % n:
        problems.append(f"{gather.where()}: streaming takes until/n whole groups a step, "
                        f"but until={until} and '{gen.name}' has n={n!r}; pass n= to the "
                        f"generate call and gather a multiple of it (data.batch_size * n)")
    screened = set(entrance_names(plan, gen, gather)) | {gen.name}
    for node in plan.nodes:
        read = [d for d in node.deps if d in screened]
        if read and node.name not in screened and node.name != gather.name:
            problems.append(f"{node.where()}: with a gather, trainer.async_mode=streaming "
                            f"hands over the gather's rows only, but this node reads "
                            f"{read}; read '{gather.name}' or set trainer.async_mode=pipeline")
    return problems


def groups_per_step(gen: PlanNode, gather: PlanNode) -> int:
    return gather.kwargs["until"] // gen.kwargs["n"]


def entrance_plan(plan: ExecutionPlan, gen: PlanNode, gather: PlanNode | None,
                  staleness: int, names: list[str] | None = None) -> ExecutionPlan | None:
    """The plan of an entrance pass (None when there is nothing to run: a gather that
    reads the generate node itself): the sources and the generate node (skipped), a
    buffer node fed the whole groups, and the entrance nodes reading it (`names`:
    the stream-side nodes of a plan without a gather, plan/streaming_split.py; by
    default the gather's entrance nodes). The stream's columns (`token_versions`,
    ...) are the generate method's own, so they travel through the nodes that
    forward their input as any column does."""
    if names is None:
        names = entrance_names(plan, gen, gather)
    if not names:
        return None
    feed = PlanNode(BUFFER_PREFIX + gen.name, NodeKind.BUFFER, Op.BUFFER, (gen.name,),
                    f"{gen.location}; screened at the buffer's entrance",
                    writes=gen.writes, input_keys=dict(gen.output_keys),
                    output_keys=dict(gen.output_keys),
                    buffer=BufferSpec(gen.name, staleness, PROMPT_UNIT, staleness,
                                      mode=AsyncMode.STREAMING))
    nodes = [n for n in plan.nodes if n.op is Op.SOURCE] + [gen, feed]
    for name in names:
        node = plan.node(name)
        deps = tuple(feed.name if d == gen.name else d for d in node.deps)
        nodes.append(replace(node, deps=deps, after=()))
    return replace(plan, nodes=nodes, stages=plan_stages(nodes))

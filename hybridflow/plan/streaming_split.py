"""Streaming rollout from the same graph (`trainer.async_mode=streaming`).

In the pipelined mode (async_split.py) the rollout side runs whole batches k steps
ahead. Streaming generates continuously instead: the rollout engine holds requests in
flight across weight updates and samples leave it one by one as they finish, so the
hand-off sits right at the generate node. The split:

- the **stream side**: the data source and the one generate node it feeds (driven by
  the run's streaming scheduler through the engine's submit / poll / abort, not as a
  node of a pass);
- the **train side**: everything else, rule rewards, reference log-probs and group
  advantages included: they run on each consumed batch of whole groups.

A graph with a gather (DAPO's dynamic sampling) streams with the gather as a filter at
the buffer's entrance (stream_filter.py): the nodes between the generate node and the
gather join the stream side and screen each whole group, and the buffer sits at the
gather.

The one buffer, `buffer/<generate node>`, is a `BufferSpec` with `streaming=True`:
capacity k (batches' worth of prompts in flight or buffered beyond the one being
trained), unit `uid` (a GRPO group admitted whole), admission of each sample whose
oldest token was sampled by weights at least the trained version - k. Its rows also
carry `token_versions` (per token, for partial rollouts).

What streaming refuses, before launch (GraphError naming the node): everything the
pipelined split refuses; more or fewer than one generate node; a generate node fed by
anything but a source, or by a role that cannot stream (no `stream_submit`); a
gather that cannot filter at the entrance (stream_filter.py); a train-side node reading a
source directly (the stream hands over the generate node's rows only, which forward
the prompt's columns). The off-policy refusal of an uncorrected update is the
pipelined one, on the streaming sides.

Stateless: functions of a plan.
"""
from __future__ import annotations

from dataclasses import replace

from hybridflow.core.kinds import NodeKind, Op
from hybridflow.plan.async_split import (PROMPT_UNIT, Sides, buffer_nodes,
                                         correction_problems, insert_buffers, split_sides)
from hybridflow.plan.compiler import ExecutionPlan, GraphError, plan_stages
from hybridflow.plan.stream_filter import (TOKEN_VERSIONS, entrance_names, filter_problems,
                                           stream_gather)

__all__ = ["streaming_sides", "attach_streaming", "is_streaming", "stream_buffer",
           "TOKEN_VERSIONS", "STREAM_METHOD"]

# TOKEN_VERSIONS, "token_versions" [B, R]: the policy version that sampled each token
STREAM_METHOD = "stream_submit"    # a role that can stream has it (RolloutWorker)


def _problems(plan: ExecutionPlan, sides: Sides) -> tuple[list[str], list]:
    k, problems = sides.staleness, []
    gens = [plan.node(n) for n in sides.rollout if plan.node(n).kind is NodeKind.GENERATE]
    if len(gens) != 1:
        problems.append(f"trainer.async_mode=streaming streams one generate node, but graph "
                        f"'{plan.graph_name}' has {len(gens)} ({[g.name for g in gens]}); "
                        f"set trainer.async_mode=pipeline (trainer.staleness={k})")
        return problems, gens
    gen = gens[0]
    if not gen.deps or any(plan.node(d).op is not Op.SOURCE for d in gen.deps):
        problems.append(f"{gen.where()}: trainer.async_mode=streaming feeds this generate "
                        f"node from the data source only, but it reads {list(gen.deps)}; "
                        f"set trainer.async_mode=pipeline")
    cls = plan.bindings.get(gen.role)
    if gen.op is not Op.CALL or not callable(getattr(cls, STREAM_METHOD, None)):
        problems.append(f"{gen.where()}: trainer.async_mode=streaming needs a generate "
                        f"call of a role that streams (the 'rollout' role: "
                        f"g.call('rollout.generate', ...)); role '{gen.role}' "
                        f"({getattr(cls, '__name__', cls)}) has no {STREAM_METHOD}")
    if PROMPT_UNIT not in gen.output_keys:
        problems.append(f"{gen.where()}: streaming admits whole prompt groups by "
                        f"'{PROMPT_UNIT}', which this node's rows do not carry")
    gathers = [n for n in plan.nodes if n.op is Op.GATHER]
    problems += filter_problems(plan, gen, gathers)
    for node in plan.nodes:
        if node.name != gen.name and any(plan.node(d).op is Op.SOURCE for d in node.deps):
            problems.append(f"{node.where()}: trainer.async_mode=streaming hands over the "
                            f"generate node's rows only, but this node reads a source "
                            f"directly; read '{gen.name}' (it forwards the prompt's "
                            f"columns) or set trainer.async_mode=pipeline")
    return problems, gens


def streaming_sides(plan: ExecutionPlan, staleness: int) -> Sides:
    """The stream side (sources + the generate node) and the train side (the rest)."""
    sides = split_sides(plan, staleness)  # its refusals hold for streaming too
    problems, gens = _problems(plan, sides)
    if problems:
        raise GraphError(plan.graph_name, problems)
    gen, gather = gens[0], stream_gather(plan)
    stream = {n.name for n in plan.nodes if n.op is Op.SOURCE} | {gen.name}
    if gather is not None:  # DAPO's filter: at the buffer's entrance (stream_filter.py)
        stream |= set(entrance_names(plan, gen, gather)) | {gather.name}
    order = [n.name for n in plan.nodes]
    handoff = (gather or gen).name
    return Sides(tuple(n for n in order if n in stream),
                 tuple(n for n in order if n not in stream), (handoff,), staleness)


def attach_streaming(plan: ExecutionPlan, staleness: int, allow_uncorrected: bool = False,
                     default_corrects=lambda node: False) -> ExecutionPlan:
    """`plan` with its one streaming buffer; GraphError (naming the node) when it cannot
    stream or an update goes uncorrected without the opt-out."""
    sides = streaming_sides(plan, staleness)
    problems = [] if allow_uncorrected else \
        correction_problems(plan, sides, default_corrects)
    if problems:
        raise GraphError(plan.graph_name, problems)
    out = insert_buffers(plan, sides)
    gather, nodes = stream_gather(plan), []
    for node in out.nodes:
        if node.op is Op.BUFFER:
            screen = gather.deps[0] if gather is not None and \
                plan.node(gather.deps[0]).kind is not NodeKind.GENERATE else None
            node = replace(node, buffer=replace(node.buffer, streaming=True,
                                                screened_by=screen),
                           writes=tuple(dict.fromkeys((*node.writes, TOKEN_VERSIONS))),
                           output_keys={**node.output_keys, TOKEN_VERSIONS: node.buffer.producer})
        nodes.append(node)
    return replace(out, nodes=nodes, stages=plan_stages(nodes))


def stream_buffer(plan: ExecutionPlan):
    """The streaming buffer node of `plan`, or None."""
    return next((n for n in buffer_nodes(plan) if n.buffer.streaming), None)


def is_streaming(plan: ExecutionPlan) -> bool:
    return stream_buffer(plan) is not None


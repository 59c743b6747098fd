"""Streaming rollout from the same graph (`trainer.async_mode=streaming`).

In the pipelined mode (async_split.py) the rollout side runs whole batches k steps
ahead. Streaming generates continuously instead: the rollout engine holds requests in
flight across weight updates and samples leave it one by one as they finish, so the
hand-off sits right at the generate node. The split:

- the **stream side**: the data source and the one generate node it feeds (driven by
  the run's streaming scheduler through the engine's submit / poll / abort, not as a
  node of a pass);
- the nodes after the generate node that can run on whole groups as they finish,
  with no weights the train side changes (`trainer.stream_side=auto`, the default;
  `stream_side_nodes`): rule-based scorers and other calls of an untrained role on the
  generate role's pool (a reference colocated with the rollout), and function nodes
  grouped by the prompt unit or declared row-wise (`grpo_advantages`). They join the
  stream side and run in the *entrance pass* (runtime/run_long/stream_entrance.py) on each
  batch of whole groups; their rows wait with the samples on the rollout worker, and
  the train side reads each of them through a buffer of its own (`buffer/<node>`);
- the **train side**: everything else (`trainer.stream_side=generate_only`: rule
  rewards, reference log-probs and group advantages included).

A graph with a gather (DAPO's dynamic sampling) streams with the gather as a filter at
the buffer's entrance (stream_filter.py): the nodes between the generate node and the
gather join the stream side and screen each whole group, and the buffer sits at the
gather.

The one buffer, `buffer/<generate node>`, is a `BufferSpec` of mode `STREAMING`:
capacity k (batches' worth of prompts in flight or buffered beyond the one being
trained), unit `uid` (a GRPO group admitted whole), admission of each sample whose
oldest token was sampled by weights at least the trained version - k. Its rows also
carry `token_versions` (per token, for partial rollouts).

Streaming is declared, never probed: the generate node's role declares how it streams
(`STREAMS`, graph/streams.py), its generate method declares the columns a stream
writes (`STREAM_COLUMNS`: `policy_version`, `token_versions`, `rollout_log_probs`; the
buffer's rows carry them as any node's output, readable downstream), and a role that
streams through its engine needs an engine registered with `streams=True`
(`StreamBackend`, given by the program layer from the engine registry).

What streaming refuses, before launch (GraphError naming the node): everything the
pipelined split refuses; more or fewer than one generate node; a generate node fed by
anything but a source, of a role that declares no streaming, whose method does not
write the stream's columns, or whose engine does not declare streaming (naming the
role and `rollout.backend`); a gather that cannot filter at the entrance
(stream_filter.py); a train-side node reading a source directly (the stream hands over
the generate node's rows only, which forward the prompt's columns). The off-policy
refusal of an uncorrected update is the pipelined one, on the streaming sides.

Stateless: functions of a plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.core.columns import STREAM_COLUMNS, TOKEN_VERSIONS
from hybridflow.core.kinds import NodeKind, Op, RowEffect
from hybridflow.core.modes import AsyncMode, StreamSide
from hybridflow.graph.streams import STREAMS_ATTR, stream_capability
from hybridflow.plan.async_split import (PROMPT_UNIT, Sides, buffer_nodes,
                                         correction_problems, insert_buffers, split_sides)
from hybridflow.plan.compiler import ExecutionPlan, GraphError, PlanNode, plan_stages
from hybridflow.plan.stream_filter import entrance_names, filter_problems, stream_gather

__all__ = ["streaming_sides", "attach_streaming", "is_streaming", "stream_buffer",
           "stream_side_nodes", "stream_buffers", "joint_plan", "ENTRANCE_PREFIX",
           "StreamBackend", "TOKEN_VERSIONS"]

ENTRANCE_PREFIX = "entrance/"  # the feed of the entrance's nodes inside a step's pass


@dataclass(frozen=True)
class StreamBackend:
    """The rollout engine's streaming declaration, read from the engine registry by the
    program layer (this layer imports no engine): `rollout.backend`, whether it was
    registered with `streams=True`, and the engines that were."""
    name: str
    streams: bool
    streaming_engines: tuple[str, ...] = ()


def _role_problems(plan: ExecutionPlan, gen: PlanNode,
                   backend: StreamBackend | None) -> list[str]:
    """The generate node's role, its declared columns and its engine can stream."""
    cls = plan.bindings.get(gen.role)
    where, who = gen.where(), f"role '{gen.role}' ({getattr(cls, '__name__', cls)})"
    try:
        how = stream_capability(cls) if gen.op is Op.CALL else None
    except TypeError as err:  # a declaration that is not a Streams
        return [f"{where}: {err}"]
    if how is None:
        return [f"{where}: trainer.async_mode=streaming needs a generate call of a role "
                f"that streams (the 'rollout' role: g.call('rollout.generate', ...)); "
                f"{who} declares no streaming ({STREAMS_ATTR} = Streams.ENGINE or "
                f"Streams.EPISODES on the worker class, hybridflow/graph/streams.py)"]
    problems = []
    missing = [c for c in STREAM_COLUMNS if c not in gen.writes]
    if missing:
        problems.append(f"{where}: trainer.async_mode=streaming: {who} streams, but its "
                        f"'{gen.method}' method does not write {missing}; every streamed "
                        f"row carries {list(STREAM_COLUMNS)} (add them to its @method "
                        f"writes and fill them)")
    if how.needs_streaming_engine and backend is not None and not backend.streams:
        able = ", ".join(backend.streaming_engines) or "none"
        problems.append(f"{where}: trainer.async_mode=streaming: {who} streams through its "
                        f"rollout engine, but rollout.backend={backend.name!r} does not "
                        f"declare streaming (engines that stream: {able}); set "
                        f"rollout.backend to one of those or trainer.async_mode=pipeline, "
                        f"or declare the engine: register_engine(name, factory, "
                        f"streams=True), or `streams = True` on a 'package.module:factory' "
                        f"factory (docs/rollout.md)")
    return problems


def _problems(plan: ExecutionPlan, sides: Sides,
              backend: StreamBackend | None) -> tuple[list[str], list]:
    k, problems = sides.staleness, []
    gens = [plan.node(n) for n in sides.rollout if plan.node(n).kind.generates]
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
    problems += _role_problems(plan, gen, backend)
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


def _joins(plan: ExecutionPlan, node: PlanNode, pool: str | None) -> bool:
    """A node that may run on the stream side once its inputs do: row for row (its
    rows are kept with the group's samples), on whole groups or any row split, and
    on no weights the train side changes (split_sides already excludes those)."""
    if node.row_effect is not RowEffect.KEEPS:
        return False
    if node.op is Op.FN:
        return node.group_by == PROMPT_UNIT or node.rows
    return node.op is Op.CALL and node.kind is NodeKind.INFERENCE and \
        plan.placement.roles.get(node.role) == pool


def stream_side_nodes(plan: ExecutionPlan, sides: Sides, gen: PlanNode) -> list[str]:
    """The nodes after the generate node that join the stream side (plan order):
    every input on the stream side, on the pipelined rollout side (no trained role's
    weights, no state across steps), and `_joins`."""
    pool = plan.placement.roles.get(gen.role)
    stream, moved, ahead = {gen.name}, [], set(sides.rollout)
    stream |= {n.name for n in plan.nodes if n.op is Op.SOURCE}
    for node in plan.nodes:
        if node.name in stream or node.name not in ahead or not node.deps:
            continue
        if all(d in stream for d in node.deps) and _joins(plan, node, pool):
            stream.add(node.name)
            moved.append(node.name)
    return moved


def streaming_sides(plan: ExecutionPlan, staleness: int,
                    backend: StreamBackend | None = None,
                    stream_side: StreamSide = StreamSide.AUTO) -> Sides:
    """The stream side (sources, the generate node, a gather's entrance nodes, and
    with `stream_side=auto` the nodes that can run on whole groups: stream_side_nodes)
    and the train side (the rest); `backend`: the engine's declaration (None: no
    engine is checked, e.g. the planner's and the drawings' reading of a plan)."""
    sides = split_sides(plan, staleness)  # its refusals hold for streaming too
    problems, gens = _problems(plan, sides, backend)
    if problems:
        raise GraphError(plan.graph_name, problems)
    gen, gather = gens[0], stream_gather(plan)
    stream = {n.name for n in plan.nodes if n.op is Op.SOURCE} | {gen.name}
    if gather is not None:  # DAPO's filter: at the buffer's entrance (stream_filter.py)
        stream |= set(entrance_names(plan, gen, gather)) | {gather.name}
    elif stream_side.moves:  # `trainer.stream_side`, converted by core/modes.run_modes
        stream |= set(stream_side_nodes(plan, sides, gen))
    order = [n.name for n in plan.nodes]
    train = tuple(n for n in order if n not in stream)
    handoff = (gather.name,) if gather is not None else \
        tuple(n for n in order if n in stream and any(n in plan.node(t).deps for t in train))
    return Sides(tuple(n for n in order if n in stream), train, handoff, staleness)


def attach_streaming(plan: ExecutionPlan, staleness: int, allow_uncorrected: bool = False,
                     default_corrects=lambda node: False,
                     backend: StreamBackend | None = None,
                     stream_side: StreamSide = StreamSide.AUTO) -> ExecutionPlan:
    """`plan` with its streaming buffers (one per stream-side node the train side
    reads); GraphError (naming the node) when it cannot stream (its role, columns or
    `backend`) or an update goes uncorrected without the opt-out. A buffer's rows are
    its producer's, the generate node's carrying the stream's columns."""
    sides = streaming_sides(plan, staleness, backend, stream_side)
    problems = [] if allow_uncorrected else \
        correction_problems(plan, sides, default_corrects)
    if problems:
        raise GraphError(plan.graph_name, problems)
    out = insert_buffers(plan, sides)
    gather, nodes = stream_gather(plan), []
    for node in out.nodes:
        if node.op is Op.BUFFER:
            screen = gather.deps[0] if gather is not None and \
                not plan.node(gather.deps[0]).kind.generates else None
            node = replace(node, buffer=replace(node.buffer, mode=AsyncMode.STREAMING,
                                                screened_by=screen))
        nodes.append(node)
    return replace(out, nodes=nodes, stages=plan_stages(nodes))


def stream_buffer(plan: ExecutionPlan):
    """The streaming buffer node of `plan` holding the samples (the generate node's or
    the gather's rows; else the first), or None."""
    buffers = stream_buffers(plan)
    samples = [b for b in buffers if plan.node(b.buffer.producer).op is Op.GATHER
               or plan.node(b.buffer.producer).kind.generates]
    return (samples or buffers or [None])[0]


def stream_buffers(plan: ExecutionPlan) -> list[PlanNode]:
    """Every streaming buffer node of `plan` (plan order)."""
    return [n for n in buffer_nodes(plan) if n.buffer.streaming]


def is_streaming(plan: ExecutionPlan) -> bool:
    return stream_buffer(plan) is not None



def joint_plan(plan: ExecutionPlan, entrance: ExecutionPlan,
               stream_side: frozenset) -> tuple[ExecutionPlan, frozenset]:
    """A step's pass with the entrance pass inside it: (the plan, what the pass skips).
    The nodes of `plan` and the entrance's feed and nodes (runtime/run_long/
    stream_entrance.py) under their names prefixed `entrance/` (the plan's own copies,
    on the stream side, stay skipped; the columns keep their writers' names, so each
    reads what it read in the entrance pass). The two parts share no edge, so the pass
    scheduler runs each on its pool side by side: the stream side's nodes for the next
    groups overlap the update. Order is submission order on a shared worker (an actor
    runs its tasks in that order, a task waiting for its inputs holding back those
    behind it): the stream side (skipped), the train side's buffers (their takes
    first), the entrance, then the rest of the train side — so the entrance's tasks
    on the rollout's worker are not queued behind the weight sync, which waits for
    the update. Skipped: `stream_side` (the sources, the generate node, the nodes the
    entrance runs under its own names, a filter's gather)."""
    own = [n for n in entrance.nodes if n.op is not Op.SOURCE][1:]  # past the generate node
    names = {n.name for n in own}

    def inside(node: PlanNode) -> PlanNode:
        deps = tuple(ENTRANCE_PREFIX + d if d in names else d for d in node.deps)
        return replace(node, name=ENTRANCE_PREFIX + node.name, deps=deps)
    skipped = [n for n in plan.nodes if n.name in stream_side]
    buffers = [n for n in plan.nodes if n.name not in stream_side and n.op is Op.BUFFER]
    rest = [n for n in plan.nodes if n.name not in stream_side and n.op is not Op.BUFFER]
    nodes = skipped + buffers + [inside(n) for n in own] + rest
    return replace(plan, nodes=nodes, stages=plan_stages(nodes)), frozenset(stream_side)

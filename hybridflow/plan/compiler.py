"""Compiler: check a Graph against the worker declarations and a placement, then
lower it to an ExecutionPlan that both runtimes execute.

Every check runs before any worker starts. All problems found are reported at once,
each naming the node and the file:line where the user created it.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from hybridflow.graph.dispatch import MethodSpec, get_dispatch_mode, worker_methods
from hybridflow.graph.builder import FnSpec, Graph, Node, fn_spec
from hybridflow.core.kinds import NodeKind, Op, RowEffect
from hybridflow.graph.loss import call_keys
from hybridflow.plan.placement import Placement
from hybridflow.plan.weight_sync import insert_weight_sync

__all__ = ["GraphError", "PlanNode", "ExecutionPlan", "compile_graph", "plan_stages"]


class GraphError(ValueError):
    """A graph that cannot run; `problems` holds one message per defect."""

    def __init__(self, graph: str, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"graph '{graph}' has {len(problems)} problem(s):\n{lines}")


@dataclass
class PlanNode:
    name: str
    kind: NodeKind                 # what the work is (a string converts)
    op: Op                         # how the graph made it: source | call | fn | gather
    deps: tuple[str, ...]
    location: str
    role: str | None = None
    method: str | None = None
    pool: str | None = None
    dispatch: str | None = None
    reads: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()   # after renames
    kwargs: dict[str, Any] = field(default_factory=dict)
    fn: Callable | None = None
    group_by: str | None = None
    rows: bool = False             # fn may run on any row split
    forwards: bool = False
    rename: dict[str, str] = field(default_factory=dict)
    input_keys: dict[str, str] = field(default_factory=dict)   # key -> writer node
    output_keys: dict[str, str] = field(default_factory=dict)  # key -> writer node
    buffer: Any = None             # async_split.BufferSpec of a BUFFER node
    after: tuple[str, ...] = ()    # ordering only: waits for these when they run in the
    #                                same scheduler pass (async: the weights it changes)

    def __post_init__(self):
        self.kind = NodeKind.of(self.kind, "node kind")
        self.op = Op.of(self.op, "node op")

    @property
    def row_effect(self) -> RowEffect:
        """What the node does to its input rows (a gather collects rounds)."""
        return RowEffect.GATHERS if self.op is Op.GATHER else self.kind.row_effect

    def where(self) -> str:
        return f"node '{self.name}' ({self.location})"


@dataclass
class ExecutionPlan:
    graph_name: str
    nodes: list[PlanNode]          # topological order
    placement: Placement
    bindings: dict[str, type]
    stages: list[list[str]]        # nodes in one stage may run at the same time
    warnings: list[str] = field(default_factory=list)
    unneeded: list = field(default_factory=list)  # plan/unneeded.py: removed or kept, why

    @property
    def sides(self):
        raise AttributeError("ExecutionPlan.sides was removed: an async plan holds BUFFER "
                             "nodes; read its sides with hybridflow.plan.async_split."
                             "sides_of(plan) (docs/async.md)")

    def node(self, name: str) -> PlanNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"plan of graph '{self.graph_name}' has no node {name!r}")

    @property
    def roles(self) -> list[str]:
        return sorted({n.role for n in self.nodes if n.role})

    def consumers(self, name: str) -> list[str]:
        return [n.name for n in self.nodes if name in n.deps]

    def summary(self) -> str:
        lines = [f"graph '{self.graph_name}': {len(self.nodes)} nodes, roles "
                 f"{', '.join(self.roles) or '-'}"]
        from hybridflow.plan.sites import site_label  # where a function node runs
        folded = self.placement.folded
        for n in self.nodes:
            where = f"{n.role}@{n.pool} [{n.dispatch}]" if n.role else \
                site_label(self, n) if n.op is Op.FN else "driver"
            if n.role in folded:
                where = f"{n.role}→{folded[n.role]}@{n.pool} [{n.dispatch}]"
            lines.append(f"  {n.name:<22} {n.kind:<9} {where:<28} "
                         f"reads {','.join(n.reads) or '-'} -> writes {','.join(n.writes) or '-'}")
        for pool, roles in self.placement.colocated().items():
            spec = self.placement.pools.get(pool)
            size = spec.world_size if spec else 0
            lines.append(f"  pool {pool}: {size} device(s), colocated roles: "
                         f"{', '.join(sorted(roles)) or '-'}")
        lines += self.placement.layout_lines(self.roles)
        for role, host in sorted(folded.items()):
            if role in self.roles:
                lines.append(f"  folded: {role} is served by {host}'s worker (no model of "
                             f"its own)")
        lines.append("  concurrency: " + " | ".join("{" + ", ".join(s) + "}" for s in self.stages))
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [text for section in SUMMARY_SECTIONS if (text := section(self))]
        return "\n".join(lines)


# What the passes that rewrite a plan add to its summary: each registers a function
# (plan -> text, or None when the plan has nothing of its own) when it is imported, so
# the compiler names none of them (async_split registers the buffers' lines).
SUMMARY_SECTIONS: list = []


def _suggest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else \
        f"; known: {sorted(options)}"


class _Checker:
    def __init__(self, graph: Graph, bindings: dict[str, type], placement: Placement):
        self.graph, self.bindings, self.placement = graph, bindings, placement
        self.problems: list[str] = list(graph.problems)
        self.warnings: list[str] = []
        self.replaced: dict[tuple[str, str], str] = {}  # (writer, key) -> writer it overwrote

    def fail(self, node: Node | PlanNode, message: str) -> None:
        self.problems.append(f"{node.where()}: {message}")

    # ---- step 1: resolve each node's declaration
    def resolve(self, node: Node) -> PlanNode | None:
        if node.op is Op.SOURCE:
            keys = {k: node.name for k in node.provides}
            return PlanNode(node.name, NodeKind.SOURCE, Op.SOURCE, node.inputs, node.location,
                            writes=node.provides, output_keys=keys)
        if node.op is Op.FN:
            return self._resolve_fn(node)
        if node.op is Op.GATHER:
            return self._resolve_gather(node)
        return self._resolve_call(node)

    def _resolve_fn(self, node: Node) -> PlanNode | None:
        spec: FnSpec | None = fn_spec(node.fn) if callable(node.fn) else None
        if spec is None:
            self.fail(node, f"function {node.target!r} has no @node_fn(reads=..., writes=...) "
                            "declaration")
            return None
        self._check_kwargs(node, spec.params, spec.accepts_any_kwargs)
        return PlanNode(node.name, NodeKind.FUNCTION, Op.FN, node.inputs, node.location,
                        reads=spec.reads, optional=spec.optional,
                        writes=self._renamed(node, spec.writes), kwargs=node.kwargs,
                        fn=node.fn, group_by=node.group_by or spec.group_by, rows=spec.rows,
                        rename=node.rename, forwards=spec.forwards)

    def _resolve_gather(self, node: Node) -> PlanNode | None:
        until, rounds = node.kwargs.get("until"), node.kwargs.get("max_rounds")
        if not isinstance(until, int) or until < 1:
            self.fail(node, f"gather needs until >= 1 rows, got {until!r}")
        if not isinstance(rounds, int) or rounds < 0:
            self.fail(node, f"gather needs max_rounds >= 0, got {rounds!r}")
        if len(node.inputs) != 1:
            self.fail(node, f"gather takes exactly one input node, got {len(node.inputs)}")
        return PlanNode(node.name, NodeKind.FUNCTION, Op.GATHER, node.inputs, node.location,
                        kwargs=dict(node.kwargs), forwards=True)

    def _resolve_call(self, node: Node) -> PlanNode | None:
        cls = self.bindings.get(node.role)
        if cls is None:
            self.fail(node, f"unknown role '{node.role}': bind a worker class to it with "
                            f"workers.{node.role}=module:Class{_suggest(node.role, self.bindings)}")
            return None
        methods = worker_methods(cls)
        spec: MethodSpec | None = methods.get(node.method)
        if spec is None:
            self.fail(node, f"role '{node.role}' ({cls.__name__}) has no method "
                            f"'{node.method}'{_suggest(node.method, methods)}")
            return None
        self._check_kwargs(node, spec.params, spec.accepts_any_kwargs)
        try:
            if not get_dispatch_mode(spec.dispatch).rows:
                self.fail(node, f"{node.target} has dispatch mode '{spec.dispatch}', which "
                                f"takes one value per rank, not a batch's rows: call it with "
                                f"runtime.call_role(...), not as a graph node")
        except ValueError as err:
            self.fail(node, str(err))
        pool = self._pool_of(node)
        try:  # a loss passed by the graph brings the keys it reads
            reads, optional = call_keys(getattr(cls, node.method), spec.reads, spec.optional,
                                        node.kwargs)
        except ValueError as err:
            self.fail(node, str(err))
            reads, optional = spec.reads, spec.optional
        return PlanNode(node.name, spec.kind, Op.CALL, node.inputs, node.location,
                        role=node.role, method=node.method, pool=pool, dispatch=spec.dispatch,
                        reads=reads, optional=optional,
                        writes=self._renamed(node, spec.writes), kwargs=node.kwargs,
                        forwards=spec.forwards, rename=node.rename)

    def _renamed(self, node: Node, writes) -> tuple[str, ...]:
        for old in node.rename:
            if old not in writes:
                self.fail(node, f"rename of {old!r}, which the node does not write "
                                f"(it writes {list(writes)})")
        return tuple(node.rename.get(k, k) for k in writes)

    def _check_kwargs(self, node: Node, params, any_ok: bool) -> None:
        if any_ok:
            return
        for key in node.kwargs:
            if key not in params:
                self.fail(node, f"{node.target} does not accept argument '{key}'"
                                f"{_suggest(key, params)}")

    def _pool_of(self, node: Node) -> str | None:
        pool = self.placement.roles.get(node.role)
        if pool is None:
            self.fail(node, f"role '{node.role}' has no pool: add it to placement.roles "
                            f"(pools: {sorted(self.placement.pools)})")
            return None
        spec = self.placement.pools.get(pool)
        if spec is None:
            self.fail(node, f"role '{node.role}' is placed on pool '{pool}', which is not "
                            f"defined{_suggest(pool, self.placement.pools)}")
        elif spec.world_size < 1:
            self.fail(node, f"pool '{pool}' of role '{node.role}' has no devices")
        else:
            try:  # the role's layout, checked here once (core/layout.py)
                self.placement.layout(node.role)
            except ValueError as err:
                self.fail(node, str(err))
        return pool

    # ---- step 2: structure
    def order(self, nodes: dict[str, PlanNode]) -> list[str] | None:
        dag = nx.DiGraph()
        dag.add_nodes_from(nodes)
        unknown = False
        for node in nodes.values():
            for dep in node.deps:
                if dep not in nodes:
                    self.fail(node, f"input '{dep}' is not a node of the graph"
                                    f"{_suggest(dep, nodes)}")
                    unknown = True
                    continue
                dag.add_edge(dep, node.name)
        try:
            cycle = nx.find_cycle(dag)
        except nx.NetworkXNoCycle:
            if unknown:  # keys cannot flow along an edge that does not exist
                return None
            self.dag = dag
            return list(nx.lexicographical_topological_sort(
                dag, key=lambda n: list(nodes).index(n)))
        path = " -> ".join([e[0] for e in cycle] + [cycle[0][0]])
        first = nodes[cycle[0][0]]
        self.fail(first, f"the graph has a cycle: {path}")
        return None

    # ---- step 3: keys along edges
    def flow_keys(self, order: list[str], nodes: dict[str, PlanNode]) -> None:
        for name in order:
            node = nodes[name]
            if node.op is Op.SOURCE:
                continue
            node.input_keys = self._merge_inputs(node, nodes)
            for key in node.reads:
                if key not in node.input_keys:
                    self._missing_key(node, key, nodes)
            if node.group_by and node.group_by not in node.input_keys:
                self.fail(node, f"group_by key '{node.group_by}' is not in its input")
            out = dict(node.input_keys) if node.forwards else {}
            for key in node.writes:
                if key in node.input_keys and key not in self._overwrites(node):
                    self.fail(node, f"writes key '{key}', which already reaches it from node "
                                    f"'{node.input_keys[key]}'; declare overwrites=('{key}',) "
                                    f"or rename the output")
                if key in node.input_keys:
                    self.replaced[(name, key)] = node.input_keys[key]
                out[key] = name
            node.output_keys = out

    def _overwrites(self, node: PlanNode) -> tuple[str, ...]:
        if node.op is Op.CALL:
            spec = worker_methods(self.bindings[node.role])[node.method]
            names = spec.overwrites
        else:
            names = fn_spec(node.fn).overwrites
        return tuple(node.rename.get(k, k) for k in names)

    def _merge_inputs(self, node: PlanNode, nodes) -> dict[str, str]:
        merged: dict[str, str] = {}
        for dep in node.deps:
            for key, writer in nodes[dep].output_keys.items():
                if key in merged and merged[key] != writer and \
                        not self._shadows(writer, merged[key], key) and \
                        not self._shadows(merged[key], writer, key):
                    self.fail(node, f"key '{key}' reaches it from two writers, "
                                    f"'{merged[key]}' and '{writer}'; rename one output "
                                    f"(rename={{'{key}': '...'}})")
                elif key not in merged or self._shadows(writer, merged[key], key):
                    merged[key] = writer
        return merged

    def _shadows(self, later: str, earlier: str, key: str) -> bool:
        """`later` wins over `earlier` only if it overwrote the value `earlier` wrote
        (directly or through a chain of overwrites); a writer that merely sits
        downstream without seeing the key is a second writer, not an overwrite."""
        while (later, key) in self.replaced:
            later = self.replaced[(later, key)]
            if later == earlier:
                return True
        return False

    def _missing_key(self, node: PlanNode, key: str, nodes) -> None:
        writers = [n.name for n in nodes.values() if key in n.writes]
        hint = (f"; it is written by {writers}: pass that node as an input" if writers
                else _suggest(key, node.input_keys).replace("known", "available"))
        inputs = ", ".join(f"'{d}'" for d in node.deps) or "none"
        self.fail(node, f"reads key '{key}', which none of its inputs ({inputs}) "
                        f"provides{hint}")

    # ---- step 4: warnings
    def warn_unused(self, order: list[str], nodes: dict[str, PlanNode]) -> None:
        if not any(n.kind.trains for n in nodes.values()):
            self.warnings.append("the graph has no training node: nothing will learn")
        consumed = {d for n in nodes.values() for d in n.deps}
        for name in order:
            node = nodes[name]
            built = self.graph.nodes.get(name)  # a validation node is read by the loop
            monitor = getattr(built, "monitor", False) or getattr(built, "validation", None)
            if name not in consumed and not node.kind.trains and not monitor:
                self.warnings.append(f"{node.where()}: its output is consumed by no node")


def plan_stages(nodes: list[PlanNode]) -> list[list[str]]:
    """The stages of nodes in topological order (`ExecutionPlan.stages`), for plans
    derived from a compiled one (async sides, an inserted node)."""
    return _stages([n.name for n in nodes], {n.name: n for n in nodes})


def _stages(order: list[str], nodes: dict[str, PlanNode]) -> list[list[str]]:
    """Group nodes by dependency depth; within a depth, nodes on one pool serialise,
    so a depth splits into stages whose nodes can truly overlap (disjoint pools or
    the driver)."""
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 1 + max((depth[d] for d in nodes[name].deps), default=-1)
    levels: dict[int, list[str]] = {}
    for name in order:
        levels.setdefault(depth[name], []).append(name)
    stages = []
    for d in sorted(levels):
        level: list[list[str]] = []  # the i-th stage of a level takes a pool's i-th node
        taken: dict[str, int] = {}      # pool -> its nodes in this level so far
        for name in levels[d]:
            pool, i = nodes[name].pool, 0   # driver nodes (no pool) never wait
            if pool is not None:
                i = taken[pool] = taken.get(pool, -1) + 1
            if i == len(level):
                level.append([])
            level[i].append(name)
        stages += level
    return stages


def compile_graph(graph: Graph, bindings: dict[str, type], placement: Placement) -> ExecutionPlan:
    """Check `graph` and lower it; raises GraphError listing every problem found."""
    check = _Checker(graph, bindings, placement)
    check.problems += placement.fold_problems()
    resolved = {n.name: check.resolve(n) for n in graph.nodes.values()}
    nodes = {k: v for k, v in resolved.items() if v is not None}
    if len(nodes) != len(resolved):  # unresolved nodes: keys cannot be checked reliably
        raise GraphError(graph.name, check.problems)
    order = check.order(nodes)
    if order is not None:
        check.flow_keys(order, nodes)
        check.warn_unused(order, nodes)
    if check.problems:
        raise GraphError(graph.name, check.problems)
    return insert_weight_sync(ExecutionPlan(graph.name, [nodes[n] for n in order], placement,
                                            dict(bindings), _stages(order, nodes), check.warnings))

"""Graph builder: what a user writes to describe an algorithm.

A graph is a list of nodes; each node names its inputs (earlier nodes) and knows
where in the user's file it was created, so every later error can point there.
Four node ops (`hybridflow.core.kinds.Op`) are built here:

- source: a batch from the data loader (`g.source("prompts")`).
- call:   a role's method on its worker group (`g.call("actor.generate", prompts)`).
          Its kind (generate / inference / train) and keys come from the method's
          `@method` declaration, which the compiler looks up once roles are bound.
- fn:     a pure function over batches (`g.fn(compute_advantages, rollout, score)`),
          declared with `@node_fn(reads=..., writes=...)`.
- gather: rows of a node collected over repeated draws (`g.gather(node, until=...)`).

A node's input batch is the union of its input nodes' outputs. Inputs may also be
given by node name (a string), which lets a node refer to one defined later; the
compiler rejects the cycles this can make. `rename={"old": "new"}` renames keys of a
node's output, e.g. to keep a baseline's scores apart from the policy's.
`monitor=True` marks a node that only observes (logs metrics): nothing needs to
consume its output, so the compiler does not warn about it. `validation="greedy"`
(or `"sampled"`) marks the node of a validation graph whose `scores` the step loop
reads (docs/graphs.md#validation); the loop consumes it, so no warning either.
"""
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.graph.dispatch import _kwarg_names, keys_of
from hybridflow.core.kinds import Op

__all__ = ["Graph", "Node", "FnSpec", "node_fn", "fn_spec", "DEFAULT_SOURCE_KEYS"]

# What the prompt data loader provides (see hybridflow/core/data.py).
DEFAULT_SOURCE_KEYS = ("input_ids", "attention_mask", "position_ids", "raw_prompt", "uid",
                       "data_source", "ground_truth", "extra_info")
_FN_ATTR = "__hybridflow_fn__"


@dataclass(frozen=True)
class FnSpec:
    """Contract of a function node: keys read and written, and how it may be split.

    group_by: the function may run on shards of the batch as long as every row of a
    group is in one shard (e.g. group advantages by "uid"); None means it may run
    on any row split when `rows=True`, or only on the whole batch otherwise.
    forwards: the output also carries every input column, row-aligned with the
    output (a filter returns a subset of its input rows this way).
    """
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    overwrites: tuple[str, ...] = ()
    group_by: str | None = None
    rows: bool = False
    params: tuple[str, ...] = ()
    accepts_any_kwargs: bool = False
    forwards: bool = False


def node_fn(*, reads=(), writes=(), optional=(), overwrites=(), group_by=None, rows=False,
            forwards=False):
    """Declare a function node: `fn(batch, **kwargs) -> Batch` of the written keys.
    On a class, every instance is the node and `__call__(self, batch, **kwargs)` its
    body (a callable that keeps state; see docs/functions.md)."""
    def wrap(fn: Callable) -> Callable:
        is_class = isinstance(fn, type)
        params, var_kw = _kwarg_names(fn.__call__ if is_class else fn, skip=2 if is_class else 1)
        setattr(fn, _FN_ATTR, FnSpec(keys_of(reads), keys_of(writes), keys_of(optional),
                                     keys_of(overwrites), group_by, rows, params, var_kw,
                                     forwards))
        if is_class:
            _name_instances(fn)
        return fn
    return wrap


def _name_instances(cls: type) -> None:
    """Each instance gets `__name__` (the node's default name): the class's in
    snake case, unless its __init__ set one."""
    init, name = cls.__init__, "".join(f"_{c.lower()}" if c.isupper() and i else c.lower()
                                       for i, c in enumerate(cls.__name__))

    @functools.wraps(init)
    def named_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if "__name__" not in vars(self):
            self.__name__ = name
    cls.__init__ = named_init


def fn_spec(fn: Callable) -> FnSpec | None:
    return getattr(fn, _FN_ATTR, None)


@dataclass
class Node:
    name: str
    op: Op                        # source | call | fn | gather (a string converts)
    inputs: tuple[str, ...]
    kwargs: dict[str, Any]
    location: str                 # "file.py:line" where the user created it
    role: str | None = None
    method: str | None = None
    fn: Callable | None = None
    provides: tuple[str, ...] = ()  # source nodes only
    group_by: str | None = None     # fn nodes: overrides the declaration
    rename: dict[str, str] = field(default_factory=dict)  # output key -> new name
    monitor: bool = False           # only observes (metrics): no consumer is expected
    validation: str | None = None   # "greedy" / "sampled": the loop reads its scores

    def __post_init__(self):
        self.op = Op.of(self.op, "node op")

    @property
    def target(self) -> str:
        if self.op is Op.CALL:
            return f"{self.role}.{self.method}"
        if self.op is Op.FN:
            return getattr(self.fn, "__name__", repr(self.fn))
        return f"source:{self.name}"

    def where(self) -> str:
        return f"node '{self.name}' ({self.location})"


@dataclass(frozen=True)
class NodeHandle:
    """What builder calls return; pass it as an input to later calls."""
    graph: "Graph" = field(repr=False)
    name: str


def _caller_location() -> str:
    """file:line of the first frame outside this module (the user's graph file)."""
    here = os.path.abspath(__file__)
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename) == here:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class Graph:
    """An algorithm as data. Build with source / call / fn; compile with the compiler."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: dict[str, Node] = {}
        self.problems: list[str] = []  # builder-time errors, reported by the compiler

    def source(self, name: str = "prompts", keys=DEFAULT_SOURCE_KEYS) -> NodeHandle:
        return self._add(Node(name, Op.SOURCE, (), {}, _caller_location(),
                              provides=tuple(keys)))

    def call(self, target: str, *inputs: NodeHandle | str, name: str | None = None,
             rename: dict[str, str] | None = None, monitor: bool = False,
             validation: str | None = None, **kwargs) -> NodeHandle:
        location = _caller_location()
        role, dot, meth = target.partition(".")
        if not dot or not role or not meth:
            self.problems.append(f"{location}: call target {target!r} must be 'role.method'")
            role, meth = role or "?", meth or "?"
        node = Node(name or f"{role}.{meth}", Op.CALL, self._input_names(inputs, location),
                    dict(kwargs), location, role=role, method=meth, rename=dict(rename or {}),
                    monitor=monitor, validation=validation)
        return self._add(node)

    def fn(self, func: Callable, *inputs: NodeHandle | str, name: str | None = None,
           group_by: str | None = None, rename: dict[str, str] | None = None,
           monitor: bool = False, validation: str | None = None, **kwargs) -> NodeHandle:
        location = _caller_location()
        default = getattr(func, "__name__", "fn")
        node = Node(name or default, Op.FN, self._input_names(inputs, location), dict(kwargs),
                    location, fn=func, group_by=group_by, rename=dict(rename or {}),
                    monitor=monitor, validation=validation)
        return self._add(node)

    def gather(self, node: NodeHandle | str, *, until: int, max_rounds: int,
               name: str | None = None) -> NodeHandle:
        """Rows of `node`, collected over repeated draws until there are `until` of them.

        When `node` yields fewer rows (e.g. a filter dropped some), the runtime draws a
        fresh batch for every source upstream of it and re-runs the nodes in between,
        at most `max_rounds` extra times, then keeps the first `until` rows. This is
        DAPO's dynamic sampling, expressed in the graph instead of a forked trainer.
        """
        location = _caller_location()
        node_obj = Node(name or "gather", Op.GATHER, self._input_names([node], location),
                        {"until": until, "max_rounds": max_rounds}, location)
        return self._add(node_obj)

    # ----------------------------------------------------------------- helpers
    def _input_names(self, inputs, location: str) -> tuple[str, ...]:
        names = []
        for item in inputs:
            if isinstance(item, str):  # a node named later: allows feedback edges
                names.append(item)
            elif not isinstance(item, NodeHandle):
                self.problems.append(f"{location}: input {item!r} is not a node handle "
                                     f"(pass the value returned by source/call/fn)")
            elif item.graph is not self:
                self.problems.append(f"{location}: input '{item.name}' belongs to "
                                     f"another graph ('{item.graph.name}')")
            else:
                names.append(item.name)
        return tuple(names)

    def _add(self, node: Node) -> NodeHandle:
        if node.name in self.nodes:
            first = self.nodes[node.name]
            self.problems.append(
                f"{node.location}: node name '{node.name}' is already used by the node "
                f"made at {first.location}; pass name='...' to tell them apart")
            base, i = node.name, 2
            while f"{base}#{i}" in self.nodes:
                i += 1
            node.name = f"{base}#{i}"
        self.nodes[node.name] = node
        return NodeHandle(self, node.name)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={list(self.nodes)})"

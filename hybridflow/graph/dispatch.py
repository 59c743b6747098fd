"""Method declarations and dispatch/collect modes.

A worker method declares its contract once, beside its code::

    @method(dispatch=DP, reads=("input_ids", "attention_mask"),
            writes=("old_log_probs",), kind="inference")
    def logprob(self, batch, micro_batch_size=8): ...

The compiler checks graphs against these declarations, the renderer draws them and
the runtimes use the dispatch mode to fan a call out over the ranks of a worker
group and to collect the results. A dispatch mode declares a *slot layout*
(`SlotLayout`): which contiguous chunk of rows each rank receives and which rank's
result is kept for each chunk. Users register their own with
`register_dispatch_mode(name, slots=fn(layout) -> SlotLayout)`.

State: the registry of modes by name (`_MODES`), filled at import and by
`register_dispatch_mode`, and the slot layouts computed so far by (mode, layout)
(`_LAYOUTS`, filled by `DispatchMode.slot_layout`; a mode's layout function must
depend on the layout only); nothing else changes them.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from hybridflow.core.batch import Batch
from hybridflow.core.kinds import METHOD_KINDS, NodeKind
from hybridflow.core.layout import RoleLayout
from hybridflow.core.metric_names import is_summed

__all__ = [
    "BROADCAST", "DP", "DP_TP", "ONE_PER_WORKER", "RANK_ZERO", "SKIP", "NODE_KINDS",
    "DispatchMode", "Layout", "SlotLayout", "MethodSpec", "method", "method_spec", "worker_methods",
    "register_dispatch_mode", "get_dispatch_mode", "merge_metrics",
]

BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO = (
    "broadcast", "dp", "dp_tp", "one_per_worker", "rank_zero")
NODE_KINDS = tuple(NodeKind)  # kept for callers of the string tuple
SKIP = object()  # a dispatched value meaning "this rank does not run the call"
_SPEC_ATTR = "__hybridflow_method__"


class Layout(RoleLayout):
    """How the ranks of a worker group are arranged: dp groups of tp replicas. The
    role's `core/layout.RoleLayout` under the name (and the `Layout(world_size,
    tp_size)` constructor) dispatch modes have always used."""

    def __init__(self, world_size: int, tp_size: int = 1):
        super().__init__(world_size, tp_size)


@dataclass(frozen=True)
class MethodSpec:
    """The contract of a worker method, read by compiler, renderer and runtimes.

    reads: keys the method requires in its input batch.
    optional: keys it uses when present (passed through if an input has them).
    writes: keys of its output batch. overwrites: written keys that may shadow an
    upstream key of the same name (e.g. generate's full `input_ids`).
    forwards: the output also carries every input column (row-aligned, e.g. repeated
    for n samples), so downstream nodes still see prompt-level keys like `uid`.
    """
    name: str
    dispatch: str = DP
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    kind: NodeKind = NodeKind.INFERENCE
    optional: tuple[str, ...] = ()
    overwrites: tuple[str, ...] = ()
    forwards: bool = False
    params: tuple[str, ...] = field(default=())
    accepts_any_kwargs: bool = False


def method(*, dispatch: str = DP, reads=(), writes=(), kind: str | NodeKind = "inference",
           optional=(), overwrites=(), forwards: bool = False):
    """Declare a worker method's dispatch mode, keys read and written, and node kind
    (a NodeKind or its name: generate, inference or train)."""
    if kind not in METHOD_KINDS:
        raise ValueError(f"method kind must be generate, inference or train, not {kind!r}")
    kind = NodeKind(kind)

    def wrap(fn: Callable) -> Callable:
        params, var_kw = _kwarg_names(fn, skip=2)  # self, batch
        spec = MethodSpec(fn.__name__, dispatch, keys_of(reads), keys_of(writes), kind,
                          keys_of(optional), keys_of(overwrites), forwards, params, var_kw)
        setattr(fn, _SPEC_ATTR, spec)
        return fn
    return wrap


def keys_of(keys) -> tuple[str, ...]:
    """A declaration's keys as a tuple; one string is one key, not its letters."""
    return (keys,) if isinstance(keys, str) else tuple(keys)


def _kwarg_names(fn: Callable, skip: int) -> tuple[tuple[str, ...], bool]:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    names = tuple(p.name for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def method_spec(cls_or_obj, name: str) -> MethodSpec | None:
    fn = getattr(cls_or_obj, name, None)
    return getattr(fn, _SPEC_ATTR, None)


def worker_methods(cls) -> dict[str, MethodSpec]:
    """Every declared method of a worker class, by name."""
    out = {}
    for name in dir(cls):
        spec = method_spec(cls, name)
        if spec is not None:
            out[name] = spec
    return out


def merge_metrics(dicts: list[dict], weights: list[float] | None = None) -> dict:
    """Each numeric metric over ranks (or any parts): counts (`*_total`, the one rule
    of `core.metric_names.is_summed`) summed, others the mean weighted by `weights`
    (the rows each rank saw, so uneven shards average exactly) or equal if not given."""
    if not any(dicts):  # most nodes report none
        return {}
    weights = list(weights) if weights and sum(weights) > 0 else [1.0] * len(dicts)
    keys = {k for d in dicts for k in d}
    out = {}
    for key in sorted(keys):
        pairs = [(d[key], w) for d, w in zip(dicts, weights) if key in d]
        vals = [v for v, _ in pairs]
        numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in vals)
        total = sum(w for _, w in pairs)
        if numeric and is_summed(key):
            out[key] = float(sum(vals))
        else:
            out[key] = float(sum(v * w for v, w in pairs) / total) if numeric and total \
                else vals[0]
    return out



# ------------------------------------------------------------------ slot layouts
@dataclass(frozen=True)
class SlotLayout:
    """Which rows each rank of a worker group receives, and whose results form the
    node's output. Both runtimes read only this to fan a call out and collect it.

    The input's rows are cut into `slots` contiguous chunks in row order (sizes
    differ by at most one row, as `Batch.split`). Rank r receives chunk
    `rank_slots[r]` (None: rank r does not run the call). Chunk s of the output is
    what rank `collect_ranks[s]` returned for chunk s; the output is the chunks
    concatenated in slot order. On Ray each chunk moves worker to worker to the
    ranks that receive it, and stays on its collecting rank.
    """
    slots: int
    rank_slots: tuple[int | None, ...]
    collect_ranks: tuple[int, ...]

    def __post_init__(self):
        world = len(self.rank_slots)
        if self.slots < 1 or len(self.collect_ranks) != self.slots:
            raise ValueError(f"a slot layout needs slots >= 1 and one collecting rank per "
                             f"slot; got {self.slots} slot(s), collect_ranks="
                             f"{self.collect_ranks}")
        for s, r in enumerate(self.collect_ranks):
            if not 0 <= r < world or self.rank_slots[r] != s:
                raise ValueError(f"slot {s} is collected from rank {r}, which does not "
                                 f"receive it (rank_slots={self.rank_slots})")
        for r, s in enumerate(self.rank_slots):
            if s is not None and not 0 <= s < self.slots:
                raise ValueError(f"rank {r} receives slot {s}; there are {self.slots}")

    @property
    def world_size(self) -> int:
        return len(self.rank_slots)

    @cached_property
    def runs(self) -> tuple[tuple[int, int, int | None], ...]:
        """(rank, slot it receives, output slot it fills or None) for every rank that
        runs, in rank order (worked out once; a layout never changes)."""
        return tuple((r, s, self.collector_slot(r)) for r, s in enumerate(self.rank_slots)
                     if s is not None)

    def collector_slot(self, rank: int) -> int | None:
        """The output slot this rank's result fills, or None (a replica, or idle)."""
        s = self.rank_slots[rank]
        return s if s is not None and self.collect_ranks[s] == rank else None

    def receiver(self, slot: int) -> int:
        """The first rank that receives a slot: where a batch put for it lives."""
        return self.rank_slots.index(slot)

    def dispatch(self, value: Batch) -> list:
        chunks = value.split(self.slots)
        return [SKIP if s is None else chunks[s] for s in self.rank_slots]

    def collect(self, outputs: list) -> Batch:
        return _concat_collect([outputs[r] for r in self.collect_ranks])


def _dp_slots(layout: Layout) -> SlotLayout:
    # the ranks of a row group (sp x tp) work on its rows together: a data-parallel
    # call splits over the groups, never over the ranks of one group
    if getattr(layout, "row_group_size", layout.tp_size) > 1:
        return _dp_tp_slots(layout)
    ranks = tuple(range(layout.world_size))
    return SlotLayout(layout.world_size, ranks, ranks)


def _dp_tp_slots(layout: RoleLayout) -> SlotLayout:
    return SlotLayout(layout.dp, tuple(layout.dp_rank(r) for r in range(layout.world)),
                      tuple(layout.row_group(s)[0] for s in range(layout.dp)))


def _broadcast_slots(layout: Layout) -> SlotLayout:
    return SlotLayout(1, (0,) * layout.world_size, (0,))


def _rank_zero_slots(layout: Layout) -> SlotLayout:
    return SlotLayout(1, (0,) + (None,) * (layout.world_size - 1), (0,))


def _concat_collect(outputs: list) -> Batch:
    merged = Batch.concat(outputs)
    present = [o for o in outputs if o is not None]
    metrics = [o.meta.get("metrics", {}) for o in present]
    if any(metrics):
        merged.meta = {**merged.meta, "metrics": merge_metrics(metrics, [len(o) for o in present])}
    return merged


@dataclass(frozen=True)
class DispatchMode:
    """A named way to fan a call out over a group's ranks and collect the results.

    `slots(layout) -> SlotLayout` is the way every row mode is declared and the way
    to register one. `dispatch_fn`/`collect_fn` (a pair of functions over the whole
    value) is `one_per_worker`'s alone: its input is one value per rank, not rows
    (`rows=False`: it cannot be a graph node's dispatch).
    """
    name: str
    slots: Callable[[Layout], SlotLayout] | None = None
    dispatch_fn: Callable[[Any, Layout], list] | None = None
    collect_fn: Callable[[list, Layout], Any] | None = None
    rows: bool = True

    def slot_layout(self, layout: Layout) -> SlotLayout | None:
        if self.slots is None:
            return None
        key = (self.name, layout)
        if key not in _LAYOUTS:  # asked for every node of every step: computed once
            out = self.slots(layout)
            if out.world_size != layout.world_size:
                raise ValueError(f"dispatch mode {self.name!r} gave a layout of "
                                 f"{out.world_size} ranks for a group of "
                                 f"{layout.world_size}")
            _LAYOUTS[key] = out
        return _LAYOUTS[key]

    def dispatch(self, value: Any, layout: Layout) -> list:
        """Per-rank values (SKIP where a rank does not run)."""
        if self.slots is not None:
            return self.slot_layout(layout).dispatch(value)
        return self.dispatch_fn(value, layout)

    def collect(self, outputs: list, layout: Layout) -> Any:
        if self.slots is not None:
            return self.slot_layout(layout).collect(outputs)
        return self.collect_fn(outputs, layout)


def _one_per_worker_dispatch(value: list, layout: Layout) -> list:
    if not isinstance(value, (list, tuple)) or len(value) != layout.world_size:
        raise ValueError(f"one_per_worker needs a list of {layout.world_size} inputs, "
                         f"got {type(value).__name__}")
    return list(value)


_LAYOUTS: dict[tuple[str, Layout], SlotLayout] = {}
_MODES: dict[str, DispatchMode] = {
    BROADCAST: DispatchMode(BROADCAST, _broadcast_slots),
    DP: DispatchMode(DP, _dp_slots),
    DP_TP: DispatchMode(DP_TP, _dp_tp_slots),
    RANK_ZERO: DispatchMode(RANK_ZERO, _rank_zero_slots),
    ONE_PER_WORKER: DispatchMode(ONE_PER_WORKER, dispatch_fn=_one_per_worker_dispatch,
                                 collect_fn=lambda outputs, layout: list(outputs), rows=False),
}


def register_dispatch_mode(name: str, dispatch: Callable | None = None,
                           collect: Callable | None = None, *,
                           slots: Callable[[Layout], SlotLayout] | None = None) -> None:
    """Add a user-defined mode: `slots(layout) -> SlotLayout`, which rows each rank
    receives and whose results are kept; it runs on Ray with shards moving worker to
    worker, like the built-in modes.

    `dispatch` and `collect` are accepted only to refuse the older (dispatch, collect)
    pair form, removed (it routed every row through rank 0), with the way to migrate."""
    if dispatch is not None or collect is not None:
        raise ValueError(
            f"dispatch mode {name!r} is registered as a (dispatch, collect) pair of "
            f"functions, a form that was removed: declare which rows each rank receives "
            f"instead, register_dispatch_mode({name!r}, slots=fn(layout) -> SlotLayout) "
            f"(docs/runtime.md, 'Registering a mode', shows a pair rewritten as slots)")
    if slots is None:
        raise ValueError(f"dispatch mode {name!r} needs slots=fn(layout) -> SlotLayout")
    if name in _MODES:
        raise ValueError(f"dispatch mode {name!r} is already registered")
    _MODES[name] = DispatchMode(name, slots)


def get_dispatch_mode(name: str) -> DispatchMode:
    try:
        return _MODES[name]
    except KeyError:
        raise ValueError(f"unknown dispatch mode {name!r}; known: {sorted(_MODES)}") from None


def is_data_parallel(name: str) -> bool:
    return name in (DP, DP_TP)

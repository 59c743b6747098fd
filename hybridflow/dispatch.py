"""Method declarations and dispatch/collect modes.

A worker method declares its contract once, beside its code::

    @method(dispatch=DP, reads=("input_ids", "attention_mask"),
            writes=("old_log_probs",), kind="inference")
    def logprob(self, batch, micro_batch_size=8): ...

The compiler checks graphs against these declarations, the renderer draws them and
the runtimes use the dispatch mode to fan a call out over the ranks of a worker
group and to collect the results. A dispatch mode is a pair of plain functions
(`dispatch(value, layout) -> per-rank args`, `collect(outputs, layout) -> value`);
users register their own with `register_dispatch_mode`.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.batch import Batch

__all__ = [
    "BROADCAST", "DP", "DP_TP", "ONE_PER_WORKER", "RANK_ZERO", "SKIP", "NODE_KINDS",
    "DispatchMode", "Layout", "MethodSpec", "method", "method_spec", "worker_methods",
    "register_dispatch_mode", "get_dispatch_mode", "merge_metrics",
]

BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO = (
    "broadcast", "dp", "dp_tp", "one_per_worker", "rank_zero")
NODE_KINDS = ("source", "generate", "inference", "train", "function")
SKIP = object()  # a dispatched value meaning "this rank does not run the call"
_SPEC_ATTR = "__hybridflow_method__"


@dataclass(frozen=True)
class Layout:
    """How the ranks of a worker group are arranged: dp groups of tp replicas."""
    world_size: int
    tp_size: int = 1

    def __post_init__(self):
        if self.tp_size < 1 or self.world_size < 1 or self.world_size % self.tp_size:
            raise ValueError(f"world size {self.world_size} is not a positive multiple of "
                             f"the tensor-parallel size {self.tp_size}")

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size


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
    kind: str = "inference"
    optional: tuple[str, ...] = ()
    overwrites: tuple[str, ...] = ()
    forwards: bool = False
    params: tuple[str, ...] = field(default=())
    accepts_any_kwargs: bool = False


def method(*, dispatch: str = DP, reads=(), writes=(), kind: str = "inference",
           optional=(), overwrites=(), forwards: bool = False):
    """Declare a worker method's dispatch mode, keys read and written, and node kind."""
    if kind not in NODE_KINDS[1:4]:
        raise ValueError(f"method kind must be generate, inference or train, not {kind!r}")

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


@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch: Callable[[Any, Layout], list]
    collect: Callable[[list, Layout], Any]


def merge_metrics(dicts: list[dict], weights: list[float] | None = None) -> dict:
    """Mean of each numeric metric over ranks, weighted by `weights` (the rows each
    rank saw, so uneven shards average exactly) or equal when not given."""
    weights = list(weights) if weights and sum(weights) > 0 else [1.0] * len(dicts)
    keys = {k for d in dicts for k in d}
    out = {}
    for key in sorted(keys):
        pairs = [(d[key], w) for d, w in zip(dicts, weights) if key in d]
        vals = [v for v, _ in pairs]
        numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in vals)
        total = sum(w for _, w in pairs)
        out[key] = float(sum(v * w for v, w in pairs) / total) if numeric and total else vals[0]
    return out


def _concat_collect(outputs: list) -> Batch:
    merged = Batch.concat(outputs)
    present = [o for o in outputs if o is not None]
    metrics = [o.meta.get("metrics", {}) for o in present]
    if any(metrics):
        merged.meta = {**merged.meta, "metrics": merge_metrics(metrics, [len(o) for o in present])}
    return merged


def _dp_dispatch(value: Batch, layout: Layout) -> list:
    return value.split(layout.world_size)


def _dp_tp_dispatch(value: Batch, layout: Layout) -> list:
    shards = value.split(layout.dp_size)
    return [shards[r // layout.tp_size] for r in range(layout.world_size)]


def _dp_tp_collect(outputs: list, layout: Layout) -> Batch:
    return _concat_collect(outputs[::layout.tp_size])


def _one_per_worker_dispatch(value: list, layout: Layout) -> list:
    if not isinstance(value, (list, tuple)) or len(value) != layout.world_size:
        raise ValueError(f"one_per_worker needs a list of {layout.world_size} inputs, "
                         f"got {type(value).__name__}")
    return list(value)


_MODES: dict[str, DispatchMode] = {
    BROADCAST: DispatchMode(BROADCAST, lambda v, l: [v] * l.world_size, lambda o, l: list(o)),
    DP: DispatchMode(DP, _dp_dispatch, lambda o, l: _concat_collect(o)),
    DP_TP: DispatchMode(DP_TP, _dp_tp_dispatch, _dp_tp_collect),
    ONE_PER_WORKER: DispatchMode(ONE_PER_WORKER, _one_per_worker_dispatch,
                                 lambda o, l: list(o)),
    RANK_ZERO: DispatchMode(RANK_ZERO, lambda v, l: [v] + [SKIP] * (l.world_size - 1),
                            lambda o, l: o[0]),
}


def register_dispatch_mode(name: str, dispatch: Callable, collect: Callable) -> None:
    """Add a user-defined mode: dispatch(value, layout) -> list of per-rank values
    (SKIP where a rank does not run), collect(outputs, layout) -> value."""
    if name in _MODES:
        raise ValueError(f"dispatch mode {name!r} is already registered")
    _MODES[name] = DispatchMode(name, dispatch, collect)


def get_dispatch_mode(name: str) -> DispatchMode:
    try:
        return _MODES[name]
    except KeyError:
        raise ValueError(f"unknown dispatch mode {name!r}; known: {sorted(_MODES)}") from None


def is_data_parallel(name: str) -> bool:
    return name in (DP, DP_TP)

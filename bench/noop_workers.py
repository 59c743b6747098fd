"""No-op roles and graphs for bench/dispatch.py: a role whose methods only rename a
column, so what a call costs is the engine's work around it.

`make` builds the [rows, width] float32 batch on each worker (a batch born on the
workers, as rollouts are); `n1`..`n8` each pass `x{i-1}` on as `x{i}` (no copy).
Shipped to Ray workers by value, like a user's graph file.
"""
from __future__ import annotations

import torch

from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import compile_graph
from hybridflow.graph.dispatch import DP, method
from hybridflow.graph.builder import Graph
from hybridflow.plan.placement import Placement

CHAIN = 8
WIDTH = 128


class NoopWorker:
    def __init__(self, cfg, ctx):
        self.ctx = ctx

    @method(dispatch=DP, reads=("seed",), writes=("x0",))
    def make(self, batch: Batch, rows: int = 4, width: int = WIDTH) -> Batch:
        """`rows` rows of zeros per input row."""
        return Batch({"x0": torch.zeros(rows * len(batch), width)})


def _noop(i: int):
    def noop(self, batch: Batch) -> Batch:
        return Batch({f"x{i}": batch[f"x{i - 1}"]})
    noop.__name__ = noop.__qualname__ = f"n{i}"
    return method(dispatch=DP, reads=(f"x{i - 1}",), writes=(f"x{i}",))(noop)


for _i in range(1, CHAIN + 1):
    setattr(NoopWorker, f"n{_i}", _noop(_i))

BINDINGS = {"bench": NoopWorker}


def noop_graph(calls: int, born_on_workers: bool, rows: int = 4) -> Graph:
    """source -> [bench.make] -> bench.n1 -> ... -> bench.n{calls}.

    born_on_workers: the source is one seed row per worker and `make` builds `rows`
    rows each; otherwise the source is the [B, 128] batch itself (local runtime)."""
    g = Graph(f"noop{calls}")
    if born_on_workers:
        prev = g.call("bench.make", g.source("seeds", keys=("seed",)), rows=rows)
    else:
        prev = g.source("batch", keys=("x0",))
    for i in range(1, calls + 1):
        prev = g.call(f"bench.n{i}", prev)
    return g


def noop_plan(calls: int, born_on_workers: bool, rows: int = 4, workers: int = 2):
    return compile_graph(noop_graph(calls, born_on_workers, rows), BINDINGS,
                         Placement.single_pool(BINDINGS, devices=workers))
